"""One embedded server shared by every pytest-xdist worker of a session.

The owner (the pytest controller, or `harness.suite_session` when one server serves several pytest runs)
makes a state directory and exports it (`STATE_ENV`) before workers start. The first process that needs a
server starts it under a file lock and writes `<name>.json` (URL, pid, log); the others read it. A failed
start is recorded too, so other workers fail fast with the same log tail instead of trying again for a
minute each. The owner ends the server's whole process tree at the end, whichever process started it and
whatever happened to that process.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock

from harness.errors import HarnessError, ServerDied
from harness.serving.launcher import ManagedServer, embedded_server, terminate_tree

STATE_ENV = "QWEN36_SERVER_STATE_DIR"
OWNER_ENV = "QWEN36_SERVER_OWNER_PID"  # the owner: its death ends the server, whatever the workers do


@dataclass(frozen=True)
class ServerInfo:
    base_url: str
    model: str
    pid: int | None = None  # None for a server we did not start (--server-url)
    log_path: str | None = None
    command: str | None = None
    model_dir: str | None = None
    client_cpus: tuple[int, ...] | None = None  # where a client on this machine should run (harness.serving.placement)
    api_key: str | None = None  # what its requests must carry (vLLM's --api-key), None: nothing
    slowdown_file: str | None = None  # its test-only step slowdown (harness.gates.servers.set_step_slowdown)


SESSION = "session"  # the session's server; other names are the servers the perf gates compare (harness.gates.servers)
# Its KV cache: 1 GiB (1.6M tokens of the tiny model, 40 times what the gate workload holds), so that it, the
# servers compared with it and the test workers fit in the machine's 24 GiB; the cache never fills, so its size
# does not show in what is measured. Its twin's is the same setting.
SESSION_KV_GIB = 1


def slowdown_file(state_dir: Path, name: str) -> Path:
    """The file a server's test-only step slowdown is read from (patches/model_paths/step_slowdown.py)."""
    return Path(state_dir) / f"{name}.slowdown"


def embedded_env(state_dir: Path, name: str) -> dict[str, str]:
    """What every embedded server of a session gets, the session's own included, so that the twin differs from it
    in nothing: its step slowdown file (absent: no slowdown)."""
    from patches.model_paths.step_slowdown import SLOWDOWN_FILE_ENV

    return {SLOWDOWN_FILE_ENV: str(slowdown_file(state_dir, name))}


def info_of(server: ManagedServer, model_dir: str) -> ServerInfo:
    """What other processes need to know of a started embedded server."""
    from patches.model_paths.step_slowdown import SLOWDOWN_FILE_ENV

    return ServerInfo(server.base_url, server.cfg.served_model_name, server.proc.pid, str(server.log_path),
                      server.command_line, model_dir, server.client_cpus, api_key=server.cfg.api_key,
                      slowdown_file=server.cfg.env.get(SLOWDOWN_FILE_ENV))


def acquire(state_dir: Path, start: Callable[[Path], ServerInfo], name: str = SESSION) -> ServerInfo:
    """Return the server called `name`, starting it with `start(state_dir)` if nobody has yet.""" 
    state_dir = Path(state_dir)
    state = state_dir / f"{name}.json"
    with FileLock(str(state_dir / f"{name}.lock")):
        if state.exists():
            return _load(state, name)
        try:
            info = start(state_dir)
        except HarnessError as exc:  # a server that died, or one that cannot be started here (the reference's)
            state.write_text(json.dumps({"error": str(exc)}))
            raise
        state.write_text(json.dumps(asdict(info)))
        return info


def _load(state: Path, name: str) -> ServerInfo:
    data = json.loads(state.read_text())
    if "error" in data:
        raise ServerDied(f"the {name!r} server failed to start in another process: {data['error']}")
    if data.get("client_cpus") is not None:
        data["client_cpus"] = tuple(data["client_cpus"])
    return ServerInfo(**data)


def release(state_dir: Path) -> None:
    """End every server recorded in `state_dir` (called once, by the owner)."""
    for state in sorted(Path(state_dir).glob("*.json")):
        try:
            data = json.loads(state.read_text())
        except (OSError, ValueError):
            continue  # being written: its server's watchdog ends it with the owner
        if data.get("pid"):
            terminate_tree(data["pid"])


def owner_pid() -> int | None:
    """The owner's pid, whose death ends the servers it owns (None: the process that starts them)."""
    owner = os.environ.get(OWNER_ENV)
    return int(owner) if owner else None


def start_embedded(state_dir: Path) -> ServerInfo:
    """The embedded tiny vLLM CPU server on a tiny model built in `state_dir`, ended when the owner dies; with a
    step slowdown file, as every server the perf gates compare with it has (harness.gates.servers)."""
    server = embedded_server(state_dir, owner_pid=owner_pid(), env=embedded_env(state_dir, SESSION),
                             cpu_kvcache_gib=SESSION_KV_GIB)
    return info_of(server.start(), server.cfg.model)
