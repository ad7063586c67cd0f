"""harness.gates.servers without starting a server: the declared switches, keys and slowdown files reach the
servers' configs, the twin differs from the session's server in nothing but its slowdown file, a slowdown is
set by replacing its file, and `exclusive` makes two holders of one server take turns."""
import fcntl
from pathlib import Path

import pytest

from harness.gates.servers import (MOE_ON, MOE_SWITCH, NO_CACHE, TWIN, by_name, compared_server, exclusive,
                                   session_api_key, set_step_slowdown)
from harness.serving.launcher import embedded_server
from harness.serving.shared_server import SESSION, SESSION_KV_GIB, ServerInfo, embedded_env, slowdown_file
from patches.model_paths.step_slowdown import SLOWDOWN_FILE_ENV


def test_a_compared_servers_env_reaches_its_server_and_an_override_adds_to_it(tmp_path):
    server = compared_server(by_name(MOE_ON), tmp_path, tmp_path, env={"EXTRA": "x"})
    assert server.cfg.env[MOE_SWITCH] == "1" and server.cfg.env["EXTRA"] == "x"
    assert MOE_SWITCH not in compared_server(by_name(NO_CACHE), tmp_path, tmp_path).cfg.env


def test_the_twin_is_the_session_server_but_for_its_log_port_and_slowdown_file(tmp_path):
    # As harness.serving.shared_server.start_embedded starts the session's server.
    session = embedded_server(tmp_path, tmp_path, env=embedded_env(tmp_path, SESSION), cpu_kvcache_gib=SESSION_KV_GIB)
    twin = compared_server(by_name(TWIN), tmp_path, tmp_path)
    assert twin.cfg.env[SLOWDOWN_FILE_ENV] == str(slowdown_file(tmp_path, TWIN))
    assert session.cfg.env[SLOWDOWN_FILE_ENV] == str(slowdown_file(tmp_path, SESSION))

    def without_where(server):
        env = {k: v for k, v in server.cfg.env.items() if k != SLOWDOWN_FILE_ENV}
        return server.cfg.__class__(**{**server.cfg.__dict__, "env": env}), server.command[server.command.index("--port") + 2:]

    assert without_where(twin) == without_where(session)


def test_the_keyed_servers_want_one_key_per_session_and_never_write_it(tmp_path):
    key = session_api_key(tmp_path)
    assert key == session_api_key(tmp_path) and len(key) >= 32
    server = compared_server(by_name(NO_CACHE), tmp_path, tmp_path)
    assert server.command[server.command.index("--api-key") + 1] == key and server.cfg.api_key == key
    assert key not in server.command_line  # logs, manifests and other processes see it redacted
    assert "--api-key" not in compared_server(by_name(TWIN), tmp_path, tmp_path).command


def test_a_slowdown_is_set_by_replacing_the_file_its_engine_reads(tmp_path):
    path = tmp_path / "twin.slowdown"
    server = ServerInfo("http://127.0.0.1:1", "m", slowdown_file=str(path))
    set_step_slowdown(server, "decode=0.2")
    inode = path.stat().st_ino
    assert path.read_text() == "decode=0.2"
    set_step_slowdown(server, "")
    assert path.read_text() == "" and path.stat().st_ino != inode  # a new file: a step never reads half of one
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    with pytest.raises(ValueError, match="no step slowdown file"):
        set_step_slowdown(ServerInfo("http://h:1", "m"), "0.1")


def _try_lock(path: Path) -> bool:
    with open(path, "a") as other:  # another open file, as another xdist worker has
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(other, fcntl.LOCK_UN)
        return True


def test_exclusive_holds_the_server_until_the_block_ends(tmp_path):
    server = ServerInfo("http://127.0.0.1:1", "m", log_path=str(tmp_path / "no-cache.log"))
    lock = tmp_path / "no-cache.hold"
    with exclusive(server):
        assert not _try_lock(lock)
    assert _try_lock(lock)
    with pytest.raises(ValueError, match="no log path"):
        with exclusive(ServerInfo("http://h:1", "m")):
            pass
