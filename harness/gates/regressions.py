"""The regressions CI's perf gates must catch, as servers: the session's embedded server plus one argument.

tests/perf_gates/test_gate_tiny_server.py measures each against the committed `cpu-tiny` baseline and asserts
that the gate flags its metric. They are declared here, not in the test, because `make test` starts them
early (harness.suite_session), during the parallel run, so the timing run measures instead of waiting:
a start is ~2 minutes on two cores, most of it one process compiling on one core.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness import shared_server
from harness.server import ManagedServer, embedded_server
from harness.shared_server import ServerInfo

# A regressed server's KV cache: 1 GiB (1.6M tokens of the tiny model, 40 times the gate workload's), not the
# session's 2, so that the session's server, these three and a test's own server fit in memory at once;
# the cache never fills, so its size does not show in what is measured.
REGRESSED_KV_GIB = 1
# The smallest chunk vLLM accepts here (max_num_batched_tokens >= max_num_seqs = 16).
PREFILL_CHUNK_TOKENS = 16


@dataclass(frozen=True)
class InjectedRegression:
    name: str
    extra_args: tuple[str, ...]
    # Start on the mirrored cores (harness.placement): two of these compile at once, one on each core.
    start_mirrored: bool = False


REGRESSIONS: tuple[InjectedRegression, ...] = (
    # no torch.compile: every decode step runs op by op
    InjectedRegression("eager", ("--enforce-eager",)),
    # prefix caching off: every official-like prompt prefills in full
    InjectedRegression("no-cache", ("--no-enable-prefix-caching",)),
    # at most 16 tokens a step: an official-like turn's ~290 uncached tokens take ~18 steps instead of one;
    # decode steps are unchanged
    InjectedRegression("slow-prefill", ("--max-num-batched-tokens", str(PREFILL_CHUNK_TOKENS)), start_mirrored=True),
)


def starter(regression: InjectedRegression, model_dir: str | Path) -> Callable[[Path], tuple[ManagedServer, str]]:
    """A `start` for shared_server.acquire: this regression's server on the session's model files."""
    def start(state_dir: Path) -> tuple[ManagedServer, str]:
        server = embedded_server(state_dir, model_dir, Path(state_dir) / f"{regression.name}.log",
                                 extra_args=regression.extra_args, cpu_kvcache_gib=REGRESSED_KV_GIB,
                                 start_mirrored=regression.start_mirrored, owner_pid=shared_server.owner_pid())
        return server.start(), str(model_dir)

    return start


def acquire_regressed(state_dir: Path, model_dir: str | Path) -> dict[str, ServerInfo]:
    """Every regression's server (shared_server names them by regression), started together where nobody
    has started it yet. One that fails raises here; the others stay up until their owner ends them all."""
    with ThreadPoolExecutor(max_workers=len(REGRESSIONS)) as pool:
        futures = {r.name: pool.submit(shared_server.acquire, state_dir, starter(r, model_dir), r.name)
                   for r in REGRESSIONS}
    return {name: future.result() for name, future in futures.items()}
