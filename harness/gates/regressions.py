"""The regressions CI's perf gates must catch, as servers: the session's embedded server plus arguments.

tests/perf_gates/ measures each against the committed `cpu-tiny` baseline and asserts that the gate flags its
metric. They are declared here, not in the tests, because `make test` starts them early
(harness.suite_session), during the parallel run, so the timing run measures instead of waiting: a start is
~2 minutes on two cores, most of it one process compiling on one core.

The server without prefix caching is eager too (`--enforce-eager`): a vLLM start is the dearest thing in CI
(five starts, four of them compiling, made it 21 minutes, 2026-12-02), an eager one skips torch.compile, and
its gated metric, official-like's cache hit rate, is a count of cached prompt tokens that no execution mode
changes. For the same reason it also serves the patch set's MoE substitution (`QWEN36_PATCH_MOE=1`), which a
count of cached tokens cannot see either: tests/patches/test_moe_substitution_server.py compares its greedy
outputs with the eager server's, whose command differs only by prefix caching, which serves no cached token
to the test's prompts (it checks). That took the fifth start, a test's own copy of this server, out of CI.
The eager regression keeps a server of its own: on the eager server with prefix caching off too, decode-micro's
Output TPS P10 fell only 23.9% (run X, 2026-12-02; -33.7% and -34.6% with `--enforce-eager` alone in runs W
and R), under what the gate could flag; whether the caching mode or the machine's drift did it, one run cannot
say, and the eager regression's size is not worth the risk. The MoE substitution stays off on it, as on the
session's server: whether it is slower or faster on the CPU would change the size of that regression.
"""
from __future__ import annotations

import contextlib
import fcntl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from harness import shared_server
from harness.server import ManagedServer, embedded_server
from harness.shared_server import ServerInfo

# A regressed server's KV cache: 1 GiB (1.6M tokens of the tiny model, 40 times the gate workload's), not the
# session's 2, so that the session's server, these and the test workers fit in memory at once;
# the cache never fills, so its size does not show in what is measured.
REGRESSED_KV_GIB = 1
# The smallest chunk vLLM accepts here (max_num_batched_tokens >= max_num_seqs = 16).
PREFILL_CHUNK_TOKENS = 16


@dataclass(frozen=True)
class InjectedRegression:
    name: str
    extra_args: tuple[str, ...]
    # Start on the mirrored cores (harness.placement), so that a start compiling beside another one does so on
    # the other core.
    start_mirrored: bool = False
    # Environment for its processes beyond the session server's (name, value pairs).
    env: tuple[tuple[str, str], ...] = ()


# The patch set's MoE substitution switch (patches/catalog.py), on in the no-cache server.
MOE_SWITCH = "QWEN36_PATCH_MOE"

# The names the tests look the servers up by.
EAGER = "eager"
NO_CACHE = "no-cache"
SLOW_PREFILL = "slow-prefill"

REGRESSIONS: tuple[InjectedRegression, ...] = (
    # no torch.compile: every decode step runs op by op
    InjectedRegression(EAGER, ("--enforce-eager",)),
    # prefix caching off: every official-like prompt prefills in full (eager and the MoE substitution on as
    # well: see above)
    InjectedRegression(NO_CACHE, ("--no-enable-prefix-caching", "--enforce-eager"), env=((MOE_SWITCH, "1"),)),
    # at most 16 tokens a step: an official-like turn's ~290 uncached tokens take ~18 steps instead of one;
    # decode steps are unchanged
    InjectedRegression(SLOW_PREFILL, ("--max-num-batched-tokens", str(PREFILL_CHUNK_TOKENS)), start_mirrored=True),
)


def by_name(name: str) -> InjectedRegression:
    found = [r for r in REGRESSIONS if r.name == name]
    if not found:
        raise KeyError(f"no injected regression {name!r}; the known ones: {[r.name for r in REGRESSIONS]}")
    return found[0]


def regressed_server(regression: InjectedRegression, work_dir: Path, model_dir: str | Path, log_path: Path,
                     **overrides) -> ManagedServer:
    """This regression's server on the session's model files, not started; `overrides` as embedded_config's
    (`env` adds to the regression's own)."""
    env = {**dict(regression.env), **overrides.pop("env", {})}
    return embedded_server(work_dir, model_dir, log_path, extra_args=regression.extra_args,
                           cpu_kvcache_gib=REGRESSED_KV_GIB, start_mirrored=regression.start_mirrored, env=env,
                           **overrides)


def starter(regression: InjectedRegression, model_dir: str | Path) -> Callable[[Path], tuple[ManagedServer, str]]:
    """A `start` for shared_server.acquire: this regression's server, owned by the test session's owner."""
    def start(state_dir: Path) -> tuple[ManagedServer, str]:
        server = regressed_server(regression, state_dir, model_dir, Path(state_dir) / f"{regression.name}.log",
                                  owner_pid=shared_server.owner_pid())
        return server.start(), str(model_dir)

    return start


def acquire_regressed(state_dir: Path, model_dir: str | Path) -> dict[str, ServerInfo]:
    """Every regression's server (shared_server names them by regression), started together where nobody
    has started it yet. One that fails raises here; the others stay up until their owner ends them all."""
    with ThreadPoolExecutor(max_workers=len(REGRESSIONS)) as pool:
        futures = {r.name: pool.submit(shared_server.acquire, state_dir, starter(r, model_dir), r.name)
                   for r in REGRESSIONS}
    return {name: future.result() for name, future in futures.items()}


@contextlib.contextmanager
def exclusive(server: ServerInfo) -> Iterator[None]:
    """Hold `server` for one test's requests, across pytest-xdist workers (a lock file beside its log): two
    tests that share a regressed server and need its requests to be the only ones in flight (the MoE test's
    sequential T=1 decodes beside the no-cache gate) take turns."""
    if not server.log_path:
        raise ValueError(f"{server.base_url}: no log path, so no lock beside it (not a server this session started)")
    with open(Path(server.log_path).with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
