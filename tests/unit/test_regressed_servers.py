"""harness.gates.regressions without starting a server: the declared switches reach the server's config, and
`exclusive` makes two holders of one server take turns."""
import fcntl
from pathlib import Path

import pytest

from harness.gates.regressions import MOE_SWITCH, SLOW_STEPS, NO_CACHE, by_name, exclusive, regressed_server
from harness.shared_server import ServerInfo


def test_a_regressions_env_reaches_its_server_and_an_override_adds_to_it(tmp_path):
    server = regressed_server(by_name(SLOW_STEPS), tmp_path, tmp_path, tmp_path / "s.log", env={"EXTRA": "x"})
    assert server.cfg.env[MOE_SWITCH] == "1" and server.cfg.env["EXTRA"] == "x"
    assert MOE_SWITCH not in regressed_server(by_name(NO_CACHE), tmp_path, tmp_path, tmp_path / "e.log").cfg.env


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
