"""One embedded server shared by every pytest-xdist worker of a session.

The controller process makes a state directory and exports it (`STATE_ENV`) before workers start. The
first worker that needs a server starts it under a file lock and writes `state.json` (URL, pid, log);
the others read it. A failed start is recorded too, so other workers fail fast with the same log tail
instead of trying again for a minute each. The controller ends the server's whole process tree at
session end, whichever worker started it and whatever happened to that worker.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock

from harness.errors import ServerDied
from harness.server import ManagedServer, terminate_tree

STATE_ENV = "QWEN36_SERVER_STATE_DIR"
OWNER_ENV = "QWEN36_SERVER_OWNER_PID"  # the controller: its death ends the server, whatever the workers do


@dataclass(frozen=True)
class ServerInfo:
    base_url: str
    model: str
    pid: int | None = None  # None for a server we did not start (--server-url)
    log_path: str | None = None
    command: str | None = None
    model_dir: str | None = None
    client_cpus: tuple[int, ...] | None = None  # where a client on this machine should run (harness.placement)


def acquire(state_dir: Path, start: Callable[[Path], tuple[ManagedServer, str]]) -> ServerInfo:
    """Return the session's server, starting it with `start(state_dir)` if nobody has yet."""
    state_dir = Path(state_dir)
    state = state_dir / "state.json"
    with FileLock(str(state_dir / "server.lock")):
        if state.exists():
            return _load(state)
        try:
            server, model_dir = start(state_dir)
        except ServerDied as exc:
            state.write_text(json.dumps({"error": str(exc)}))
            raise
        info = ServerInfo(server.base_url, server.cfg.served_model_name, server.proc.pid, str(server.log_path),
                          server.command_line, model_dir, server.client_cpus)
        state.write_text(json.dumps(asdict(info)))
        return info


def _load(state: Path) -> ServerInfo:
    data = json.loads(state.read_text())
    if "error" in data:
        raise ServerDied(f"the session's server failed to start in another worker: {data['error']}")
    if data.get("client_cpus") is not None:
        data["client_cpus"] = tuple(data["client_cpus"])
    return ServerInfo(**data)


def release(state_dir: Path) -> None:
    """End the server recorded in `state_dir`, if any (called once, by the controller)."""
    state = Path(state_dir) / "state.json"
    if not state.exists():
        return
    data = json.loads(state.read_text())
    if data.get("pid"):
        terminate_tree(data["pid"])
