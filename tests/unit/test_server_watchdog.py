"""The watchdog (harness/serving/watchdog.py) on throwaway `sleep` processes: an owner, and a group standing in for
a server's tree (a shell with two children in its own session, as ManagedServer starts vLLM)."""
from __future__ import annotations

import os
import subprocess
import time

import psutil

from harness.serving import watchdog
from harness.serving.launcher import still_running


def _group(script: str = "sleep 300 & sleep 300 & wait", children: int = 2) -> tuple[subprocess.Popen, list]:
    leader = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    for _ in range(100):
        found = psutil.Process(leader.pid).children(recursive=True)
        if len(found) == children:
            return leader, [psutil.Process(leader.pid), *found]
        time.sleep(0.05)
    raise AssertionError(f"the stand-in server did not start its {children} children")


def test_owner_death_ends_the_whole_group_and_the_watchdog(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # started by file path: the working directory does not matter
    owner = subprocess.Popen(["sleep", "300"])
    leader, procs = _group()
    dog = watchdog.start(owner.pid, leader.pid)
    try:
        time.sleep(2.5 * watchdog.POLL_S)
        assert dog.poll() is None and len(still_running(procs)) == 3  # the owner lives: nothing is touched
        owner.kill()
        owner.wait()
        assert leader.wait(timeout=10) == -15  # SIGTERM, from the watchdog
        assert dog.wait(timeout=watchdog.TERM_GRACE_S + 5) == 0
        deadline = time.monotonic() + 5
        while still_running(procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert still_running(procs) == []
    finally:
        for p in (owner, dog):
            p.kill()
        for p in still_running(procs):
            p.kill()
        leader.wait()


def test_watchdog_leaves_when_the_group_ends_first():
    leader, _ = _group()
    dog = watchdog.start(os.getpid(), leader.pid)
    try:
        os.killpg(leader.pid, 9)
        leader.wait(timeout=5)
        assert dog.wait(timeout=5 * watchdog.POLL_S) == 0
    finally:
        dog.kill()


def test_end_group_kills_a_group_that_ignores_sigterm():
    leader, procs = _group("trap '' TERM; sleep 300 & wait", children=1)  # the sleep inherits the ignored TERM
    t = time.monotonic()
    watchdog.end_group(leader.pid, grace_s=1.0)
    assert leader.wait(timeout=5) == -9 and time.monotonic() - t < 5
    deadline = time.monotonic() + 5
    while still_running(procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert still_running(procs) == []
