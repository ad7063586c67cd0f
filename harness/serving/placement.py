"""Where the embedded vLLM CPU server's processes and the benchmark client run on a small machine.

vLLM's CPU build runs three processes: the API server (HTTP, detokenising, SSE), the engine core (the
scheduler) and one worker (the model, with its OpenMP threads bound by `VLLM_CPU_OMP_THREADS_BIND`). While
it serves, the engine core and the worker busy-wait on their shared-memory queue for up to a second after
each message (`sched_yield` loops), so on two cores both cores look busy. Measured on the 2-core CI kind
(docs/perf-gates.md, "stalls"): the client that reads the SSE stream is then descheduled for 100-500 ms
at a time while the server keeps writing every ~5 ms (tcpdump on loopback shows the server's packets
inside every client-side gap), and its timestamps record a stall followed by a burst. With the client
on the worker's core, 41% of 64-token streams stalled; on the other core, 2-4%.

The layout that removes it: the engine core shares the worker's core(s) (they take turns: one computes
while the other yields), the API server and the client get the remaining core. Measured there: 1 stream
in 150 with a gap over 100 ms, and that one gap was on the server's side of the socket.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

import psutil

ENGINE_TITLE = "VLLM::EngineCore"
WORKER_TITLE = "VLLM::Worker"


@dataclass(frozen=True)
class CpuLayout:
    worker: tuple[int, ...]  # the model's OpenMP threads (vLLM binds them)
    engine: tuple[int, ...]  # the engine core (scheduler)
    frontend: tuple[int, ...]  # the API server and the benchmark client

    def server_env(self) -> dict[str, str]:
        return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, self.worker))}

    def mirrored(self) -> "CpuLayout":
        """The two-core layout on swapped cores (worker and engine on the second, frontend on the first):
        where a second server starts while another starts, so the two compile on different cores. Other
        layouts are their own mirror: swapping would change the worker's thread count."""
        if self.worker != self.engine or len(self.worker) != len(self.frontend):
            return self
        return CpuLayout(worker=self.frontend, engine=self.frontend, frontend=self.worker)

    def describe(self) -> str:
        return (f"worker cores {list(self.worker)}, engine core {list(self.engine)}, "
                f"API server and client {list(self.frontend)}")


def plan_layout(cpus: list[int] | None = None) -> CpuLayout | None:
    """The layout for the CPUs this process may use; None on one CPU (nothing to separate)."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    if len(cpus) == 2:
        return CpuLayout(worker=(cpus[0],), engine=(cpus[0],), frontend=(cpus[1],))
    return CpuLayout(worker=tuple(cpus[1:-1]), engine=(cpus[0],), frontend=(cpus[-1],))


def _set_process(pid: int, cpus: tuple[int, ...]) -> None:
    """Every thread of `pid` (sched_setaffinity binds one thread; threads started later inherit)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def process_title(p: psutil.Process) -> str:
    """What vLLM set as the process title (argv[0]), or the name; "" for a process gone meanwhile."""
    try:
        cmd = p.cmdline()
        return cmd[0] if cmd else p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def apply_to_server(leader_pid: int, layout: CpuLayout, move_worker: bool = False) -> dict[str, list[int]]:
    """Place a running server's tree: the engine core on `layout.engine`, everything else (the API server
    and its helpers) on `layout.frontend`, and the worker left where vLLM bound it unless `move_worker`
    (a server started on the mirrored layout: its one OpenMP thread per core moves, thread by thread, to
    `layout.worker`, as vLLM would have bound it there). Returns pid -> cores."""
    placed: dict[str, list[int]] = {}
    try:
        leader = psutil.Process(leader_pid)
        tree = [leader] + leader.children(recursive=True)
    except psutil.NoSuchProcess:
        return placed
    for p in tree:
        title = process_title(p)
        if title.startswith(WORKER_TITLE):
            if not move_worker:
                continue
            cores = layout.worker
        else:
            cores = layout.engine if title.startswith(ENGINE_TITLE) else layout.frontend
        _set_process(p.pid, cores)
        placed[f"{p.pid} {title.split()[0] if title else '?'}"] = list(cores)
    return placed


@contextlib.contextmanager
def client_on(cpus: tuple[int, ...] | list[int] | None) -> Iterator[None]:
    """Run the block with this process on `cpus` (the frontend cores), then restore its affinity.
    None: leave it where it is (a remote server, or a layout we do not know)."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    _set_process(os.getpid(), tuple(cpus))
    try:
        yield
    finally:
        _set_process(os.getpid(), tuple(before))
