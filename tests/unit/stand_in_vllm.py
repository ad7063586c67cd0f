"""A stand-in for a vLLM server's process tree: a leader (the API server) whose children carry vLLM's process
titles, for tests of what the harness does with such a tree (placement, health) without starting vLLM."""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
from typing import Iterator

import psutil


@contextlib.contextmanager
def stand_in_server(titles: tuple[str, ...] = ("VLLM::EngineCore", "VLLM::Worker"),
                    seconds: int = 60) -> Iterator[tuple[subprocess.Popen, dict[str, psutil.Process]]]:
    """Yields (leader, {title: child}); the whole group is killed on exit. The leader execs into `sleep`, so it
    outlives a child that is killed, as vLLM's API server does for a while after its engine core dies."""
    children = " ".join(f"(exec -a {title} sleep {seconds}) &" for title in titles)
    leader = subprocess.Popen(["bash", "-c", f"{children} exec sleep {seconds}"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        kids: dict[str, psutil.Process] = {}
        while set(kids) != set(titles):
            if time.monotonic() > deadline:
                raise AssertionError(f"the stand-in children {titles} did not start (found {sorted(kids)})")
            time.sleep(0.05)  # until every subshell has exec'd under its title
            kids = {p.cmdline()[0]: p for p in psutil.Process(leader.pid).children() if p.cmdline()}
        yield leader, kids
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, 9)
        leader.wait()
