"""`python harness/serving/watchdog.py OWNER_PID GROUP_ID`: end a server's process group once its owner is gone.

Why a separate process: a killed owner (CI timeout, kill -9) runs no teardown, and the server lives in its
own session (process group), so nothing else would end it. The watchdog exits as soon as the group is gone.

It imports the standard library only and is started by file path in isolated mode (`start`), so it runs the
same from any working directory and whether or not this checkout is installed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 1.0
TERM_GRACE_S = 10.0  # after SIGTERM, then SIGKILL


def alive(pid: int, group: bool = False) -> bool:
    """Whether the process (or process group) exists; one we may not signal exists too."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def end_group(group: int, grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM the group, SIGKILL it if any member is still there after `grace_s`."""
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if not alive(group, True):
            return
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def watch(owner: int, group: int, poll_s: float = POLL_S, grace_s: float = TERM_GRACE_S) -> None:
    """Wait while both the owner and the group live; if the owner went first, end the group."""
    while alive(owner) and alive(group, True):
        time.sleep(poll_s)
    if alive(group, True):
        end_group(group, grace_s)


def start(owner: int, group: int) -> subprocess.Popen:
    """Start a watchdog for `group` (a session leader's pid) owned by `owner`, detached in its own session."""
    # -I: no script directory, PYTHON* variables or user site on sys.path (this file needs none of them).
    return subprocess.Popen([sys.executable, "-I", str(Path(__file__).resolve()), str(owner), str(group)],
                            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: watchdog.py OWNER_PID GROUP_ID", file=sys.stderr)
        return 2
    watch(int(argv[0]), int(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
