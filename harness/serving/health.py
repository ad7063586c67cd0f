"""Which of a session's shared servers have died, and their logs' last lines.

A server that dies in the middle of a run fails the tests that use it with a 500 or a refused connection,
which say nothing of why; its log does (an engine core's traceback, or "died unexpectedly" with none: a kill
from outside, such as the kernel's OOM killer). The log lives in the run's temporary state directory, gone
once the run ends, so the tail is printed where the failure is reported: the failing test's report
(tests/conftest.py) and the end of `make test` (harness.suite_session).
"""
from __future__ import annotations

import json
from pathlib import Path

import psutil

from harness.serving.placement import ENGINE_TITLE, process_title
from harness.serving.launcher import log_tail

TAIL_LINES = 60


def _live(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE  # exited, not yet reaped by its parent
    except psutil.NoSuchProcess:
        return False


def why_down(pid: int) -> str | None:
    """Why the vLLM server led by `pid` cannot serve, or None while it can: its API server has exited, or its
    engine core has (the API server answers 500 for a while before it shuts down too)."""
    try:
        leader = psutil.Process(pid)
        tree = leader.children(recursive=True)
    except psutil.NoSuchProcess:
        return "its API server has exited"
    if not _live(leader):
        return "its API server has exited"
    if not any(_live(p) and process_title(p).startswith(ENGINE_TITLE) for p in tree):
        return "its engine core has exited"
    return None


def recorded_servers(state_dir: Path) -> dict[str, dict]:
    """The servers recorded in `state_dir` by harness.serving.shared_server, by name (their state files' contents; the
    warm-up markers beside them are not servers)."""
    servers = {}
    for state in sorted(Path(state_dir).glob("*.json")):
        try:
            data = json.loads(state.read_text())
        except (OSError, ValueError):
            continue  # being written
        if "base_url" in data:
            servers[state.stem] = data
    return servers


def memory_line() -> str:
    """The machine's memory as the kernel reports it: a death at low available memory points at the OOM killer."""
    vm = psutil.virtual_memory()
    return f"memory: {vm.available / 2**30:.1f} GiB available of {vm.total / 2**30:.1f} GiB"


def dead_server_reports(state_dir: Path, lines: int = TAIL_LINES) -> list[str]:
    """One report per server that was started and can no longer serve: its name, pid, why, and its log's tail."""
    reports = []
    for name, data in recorded_servers(state_dir).items():
        pid, log = data.get("pid"), data.get("log_path")
        why = why_down(pid) if pid else None
        if why is None:
            continue
        reports.append(f"the {name!r} server (pid {pid}, {data.get('base_url')}) is down: {why}; "
                       f"{memory_line()}; the last {lines} lines of its log {log}:\n"
                       f"{log_tail(Path(log), lines) if log else '(no log recorded)'}")
    return reports
