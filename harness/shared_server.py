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

from harness.errors import ServerDied
from harness.server import ManagedServer, embedded_server, terminate_tree

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
    client_cpus: tuple[int, ...] | None = None  # where a client on this machine should run (harness.placement)


SESSION = "session"  # the session's server; other names are servers the perf gates regress (harness.gates.regressions)


def acquire(state_dir: Path, start: Callable[[Path], tuple[ManagedServer, str]], name: str = SESSION) -> ServerInfo:
    """Return the server called `name`, starting it with `start(state_dir)` if nobody has yet."""
    state_dir = Path(state_dir)
    state = state_dir / f"{name}.json"
    with FileLock(str(state_dir / f"{name}.lock")):
        if state.exists():
            return _load(state, name)
        try:
            server, model_dir = start(state_dir)
        except ServerDied as exc:
            state.write_text(json.dumps({"error": str(exc)}))
            raise
        info = ServerInfo(server.base_url, server.cfg.served_model_name, server.proc.pid, str(server.log_path),
                          server.command_line, model_dir, server.client_cpus)
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


def start_embedded(state_dir: Path) -> tuple[ManagedServer, str]:
    """The embedded tiny vLLM CPU server on a tiny model built in `state_dir`, ended when the owner dies."""
    server = embedded_server(state_dir, owner_pid=owner_pid())
    return server.start(), server.cfg.model
