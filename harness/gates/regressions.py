"""The regressions CI's perf gates must catch, as servers: the session's embedded server plus arguments.

tests/perf_gates/ measures each against the committed `cpu-tiny` baseline and asserts that the gate flags its
metric. They are declared here, not in the tests, because `make test` starts them early
(harness.suite_session), during the parallel run, and warms them there (harness.gates.measure), so the timing
run only measures.

A vLLM start is the dearest thing in CI (process imports in three processes, and torch.compile unless eager),
so the three regressions run on two servers, both eager:
- `slow-steps` (`--enforce-eager --max-num-batched-tokens 16`, the patch set's MoE substitution on): the slower
  decode and the slower prefill. decode-micro measures its decode: every step op by op (no torch.compile),
  and the routed experts through model.moe's torch paths (`QWEN36_PATCH_MOE=1`; the issue's own example of
  "the MoE substitution forced onto a slower correct path"). official-like measures its TTFT: a turn's ~290
  uncached tokens take ~18 such steps of 16 tokens instead of one compiled step. One server for both took a
  compiling start out of CI (2026-12-02: four starts, two compiling, made `make test` 1183-1224 s). Measured
  against the session's server in the same run, its decode-micro Output TPS P10 was 36.2% lower (run II,
  2026-12-02); with the substitution off 34.5% and 35.6% (GG, HH): it adds little at T=1-2 on the CPU.
- `no-cache` (`--no-enable-prefix-caching --enforce-eager`): official-like's cache hit rate, a count of cached
  prompt tokens that no execution mode changes.
tests/patches/test_moe_substitution_server.py compares `slow-steps`'s greedy outputs (substitution on) with
`no-cache`'s (off), on prompts shorter than one 16-token step, which `no-cache` cannot serve from a cache.
Eager and no-cache on one server once weakened the decode regression to -23.9% (run X, 2026-12-02), so prefix
caching stays on where speed is gated.
"""
from __future__ import annotations

import contextlib
import fcntl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from harness import shared_server
from harness.gates.measure import Warmup, warm
from harness.gates.record import WARM_REPEATS
from harness.server import ManagedServer, embedded_server
from harness.shared_server import SESSION, ServerInfo

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
    # Environment for its processes beyond the session server's (name, value pairs).
    env: tuple[tuple[str, str], ...] = ()


# The patch set's MoE substitution switch (patches/catalog.py), on in the slow-steps server.
MOE_SWITCH = "QWEN36_PATCH_MOE"

# The names the tests look the servers up by.
SLOW_STEPS = "slow-steps"
NO_CACHE = "no-cache"

REGRESSIONS: tuple[InjectedRegression, ...] = (
    # no torch.compile and the experts on model.moe's torch paths: every step runs op by op (a slower decode);
    # at most 16 tokens a step: an official-like turn's ~290 uncached tokens take ~18 steps (a slower prefill)
    InjectedRegression(SLOW_STEPS, ("--enforce-eager", "--max-num-batched-tokens", str(PREFILL_CHUNK_TOKENS)),
                       env=((MOE_SWITCH, "1"),)),
    # prefix caching off: every official-like prompt prefills in full (eager as well: see above)
    InjectedRegression(NO_CACHE, ("--no-enable-prefix-caching", "--enforce-eager")),
)


# The warm-ups the timing run's gates measure after (harness.gates.measure), by server: official-like twice, the
# prefix cache's steady state the baseline was recorded in, on the session's server (the control) and on
# slow-steps (its prefill test). decode-micro needs none: its prompts are shorter than a KV block (no cache
# state), and each repeat sends its own warm-up requests first. `make test` runs them during its parallel run.
STEADY_PREFIX_CACHE = Warmup(WARM_REPEATS, ("official-like",))
WARMUPS: dict[str, tuple[Warmup, ...]] = {SESSION: (STEADY_PREFIX_CACHE,), SLOW_STEPS: (STEADY_PREFIX_CACHE,)}


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
                           cpu_kvcache_gib=REGRESSED_KV_GIB, env=env,
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


def warm_for_gates(servers: dict[str, ServerInfo], out_root: Path) -> list[str]:
    """Run WARMUPS on the servers of `servers` (by name) that have not had them, one after another (every
    server's worker shares one core); returns the warm-ups run now, as `server: warm-up`."""
    done = []
    for name, warmups in WARMUPS.items():
        if name not in servers:
            continue
        for warmup in warmups:
            with exclusive(servers[name]):  # the MoE test's sequential requests must not share its batches
                if warm(servers[name], warmup, out_root / name):
                    done.append(f"{name}: {warmup.name}")
    return done


@contextlib.contextmanager
def exclusive(server: ServerInfo) -> Iterator[None]:
    """Hold `server` for one test's requests, across pytest-xdist workers (a lock file beside its log, not the
    one shared_server.acquire takes to start it): the users of a regressed server that need their requests to be
    the only ones in flight (the MoE test's sequential T=1 decodes, the no-cache gate, the warm-ups) take turns."""
    if not server.log_path:
        raise ValueError(f"{server.base_url}: no log path, so no lock beside it (not a server this session started)")
    with open(Path(server.log_path).with_suffix(".hold"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
