"""The servers CI's perf gates measure beside the session's, declared in one place: `make test` starts them during
its parallel run (harness.suite_session) and the tests find them up.

Every timing verdict in CI is paired: a server measured against the session's own, interleaved block by block
on the same machine (harness.gates.interleave, harness.gates.paired), so the machine's kind and its drift cancel.
- `twin`: the session's server started a second time, same commit, same arguments, same environment. Side B of
  the A/A control; and, with its test-only step slowdown (patches/model_paths/step_slowdown.py) switched on for the
  blocks that measure it, the slower decode and the slower prefill. One start serves all three.
- `no-cache`: prefix caching off (and eager, which a count of cached tokens cannot see): the cache hit rate
  regression, and the MoE substitution test's "off" side. Started with an API key: the suites' --api-key is
  tested against it.
- `moe-on`: `no-cache` with the patch set's compute substitutions on: the routed experts and the router, and the
  served blocks (residual add + RMSNorm, gated RMSNorm, the GDN decode layer, the whole MoE block on odd layers)
  forced to the model's paths where the CPU has no table (QWEN36_SERVED_BLOCKS_FORCE=1), so every seam adapter
  runs: the substitution tests' "on" side.
- `moe-on-compiled`: `moe-on` compiled, as vLLM serves by default (no --enforce-eager: torch.compile, which the
  served blocks pass through as opaque ops, patches/model_paths/served_ops.py): the substitution tests' compiled
  "on" side, against the same eager "off".
- `reference`: the performance reference commit's own server (harness.gates.reference), for the slower-commit
  gate.

Memory: a server takes about 3.3 GiB with a 1 GiB KV cache (the tiny model's worker, engine core and API server,
measured 2026-12-03); with all five up at the end of `make test`'s parallel run and the test workers beside them,
MemAvailable never fell below 8.2 GiB of 23.5 (sampled every 2 s through a fresh-clone run, 2026-12-03). `make test` starts them two at a time
(harness.suite_session), and a start waits until MemAvailable leaves room for it and one more
(`wait_for_memory`), so that a machine with less fails a start with a message, not the kernel's OOM killer.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import psutil

from harness.errors import HarnessError
from harness.gates.measure import STEADY_PREFIX_CACHE, Warmup, warm
from harness.gates.reference import ReferenceServer, add_worktree, check_dependencies, load_reference
from harness.serving import shared_server
from harness.serving.launcher import ManagedServer, embedded_server
from harness.serving.shared_server import SESSION, SESSION_KV_GIB, ServerInfo, embedded_env
from harness.serving.step_profile import profiler_args

# A compared server's KV cache: as the session's (SESSION_KV_GIB), so that five servers and the test workers fit in
# the machine's 24 GiB.
COMPARED_KV_GIB = 1
# What one server takes (its worker with a 1 GiB KV cache, engine core and API server: 3.3 GiB, 2026-12-03); the
# reference's, recorded with its own 2 GiB cache, about 4.3.
SERVER_GIB = 3.5

# The names the tests look the servers up by.
TWIN = "twin"
NO_CACHE = "no-cache"
MOE_ON = "moe-on"
MOE_ON_COMPILED = "moe-on-compiled"
REFERENCE = "reference"

# The patch set's compute substitution switches (patches/catalog.py), on in the moe-on server: the routed experts,
# the router and the served blocks, forced (patches/model_paths/served_choice.py).
MOE_SWITCH = "QWEN36_PATCH_MOE"
ROUTER_SWITCH = "QWEN36_PATCH_ROUTER"
SERVED_NORMS_SWITCH = "QWEN36_PATCH_SERVED_NORMS"
SERVED_GDN_SWITCH = "QWEN36_PATCH_SERVED_GDN"
SERVED_MOE_SWITCH = "QWEN36_PATCH_SERVED_MOE"
SERVED_FORCE = "QWEN36_SERVED_BLOCKS_FORCE"
SUBSTITUTIONS_ON = ((MOE_SWITCH, "1"), (ROUTER_SWITCH, "1"), (SERVED_NORMS_SWITCH, "1"), (SERVED_GDN_SWITCH, "1"),
                    (SERVED_MOE_SWITCH, "1"), (SERVED_FORCE, "1"))
# Prefix caching off; eager, which a count of cached tokens cannot see and which spares the start torch.compile.
EAGER = "--enforce-eager"
NO_CACHE_ARGS = ("--no-enable-prefix-caching", EAGER)
COMPILED_NO_CACHE_ARGS = tuple(a for a in NO_CACHE_ARGS if a != EAGER)


@dataclass(frozen=True)
class ComparedServer:
    name: str
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # beyond the session server's
    kv_gib: int = COMPARED_KV_GIB
    keyed: bool = False  # started with --api-key (a key made for the session)
    # vLLM's torch profiler armed (harness.serving.step_profile; idle until /start_profile), writing into
    # trace_dir_of(server): the served decode step's launch count.
    profiled: bool = False


COMPARED: tuple[ComparedServer, ...] = (
    ComparedServer(TWIN, kv_gib=SESSION_KV_GIB),  # every setting the session's
    # Both answer only requests with the session's key (vLLM's --api-key): what a client's --api-key is tested on.
    ComparedServer(NO_CACHE, NO_CACHE_ARGS, keyed=True, profiled=True),
    ComparedServer(MOE_ON, NO_CACHE_ARGS, env=SUBSTITUTIONS_ON, keyed=True, profiled=True),
    ComparedServer(MOE_ON_COMPILED, COMPILED_NO_CACHE_ARGS, env=SUBSTITUTIONS_ON, keyed=True, profiled=True),
)


def by_name(name: str) -> ComparedServer:
    found = [s for s in COMPARED if s.name == name]
    if not found:
        raise KeyError(f"no compared server {name!r}; the known ones: {[s.name for s in COMPARED]}")
    return found[0]


def compared_server(spec: ComparedServer, state_dir: Path, model_dir: str | Path, **overrides) -> ManagedServer:
    """`spec`'s server on the session's model files, not started; `overrides` as embedded_config's."""
    env = {**embedded_env(state_dir, spec.name), **dict(spec.env), **overrides.pop("env", {})}
    log = Path(state_dir) / f"{spec.name}.log"
    extra_args = spec.extra_args + (profiler_args(_trace_dir(log)) if spec.profiled else ())
    return embedded_server(state_dir, model_dir, log, extra_args=extra_args,
                           api_key=session_api_key(state_dir) if spec.keyed else None, cpu_kvcache_gib=spec.kv_gib,
                           env=env, **overrides)


def _trace_dir(log_path: Path) -> Path:
    return log_path.with_name(log_path.stem + "-traces")


def trace_dir_of(server: ServerInfo) -> Path:
    """Where a profiled compared server's torch profiler writes its traces (beside its log)."""
    if not server.log_path:
        raise ValueError(f"{server.base_url}: no log path, so no trace folder beside it")
    return _trace_dir(Path(server.log_path))


def session_api_key(state_dir: Path) -> str:
    """The key the keyed servers of this session answer to, made once and kept beside them."""
    path = Path(state_dir) / "api-key"
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            path.write_text(secrets.token_hex(16))
        fcntl.flock(lock, fcntl.LOCK_UN)
    return path.read_text().strip()


def starter(spec: ComparedServer, model_dir: str | Path) -> Callable[[Path], ServerInfo]:
    """A `start` for shared_server.acquire: this server, owned by the test session's owner."""
    def start(state_dir: Path) -> ServerInfo:
        wait_for_memory(spec.name)
        server = compared_server(spec, state_dir, model_dir, owner_pid=shared_server.owner_pid()).start()
        return shared_server.info_of(server, str(model_dir))

    return start


def acquire_compared(state_dir: Path, model_dir: str | Path,
                     names: tuple[str, ...] | None = None) -> dict[str, ServerInfo]:
    """The compared servers of COMPARED (only `names`, if given; shared_server names them), started together where
    nobody has started them yet. One that fails raises here; the others stay up until their owner ends them all."""
    specs = [s for s in COMPARED if names is None or s.name in names]
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = {s.name: pool.submit(shared_server.acquire, state_dir, starter(s, model_dir), s.name)
                   for s in specs}
    return {name: future.result() for name, future in futures.items()}


def acquire_reference(state_dir: Path, model_dir: str | Path) -> ServerInfo:
    """The performance reference commit's server (harness.gates.reference), started where nobody has yet. A
    reference that cannot run here (other dependencies, a commit missing from the clone) raises, naming the fix,
    in every test that asks for it."""
    def start(state_dir: Path) -> ServerInfo:
        ref = load_reference()
        check_dependencies(ref)
        wait_for_memory(REFERENCE)
        worktree = add_worktree(ref, Path(state_dir) / "reference-worktree")
        return ReferenceServer(worktree, Path(state_dir) / REFERENCE, Path(model_dir),
                               owner_pid=shared_server.owner_pid()).start()

    return shared_server.acquire(state_dir, start, REFERENCE)


def wait_for_memory(name: str, need_gib: float = 2 * SERVER_GIB, timeout_s: float = 300.0) -> None:
    """Start a server only with room for it and one more starting beside it (MemAvailable); a machine that keeps
    less for `timeout_s` fails the start, naming what it had, rather than the kernel ending a process at random."""
    deadline = time.monotonic() + timeout_s
    while True:
        available = psutil.virtual_memory().available / 2**30
        if available >= need_gib:
            return
        if time.monotonic() > deadline:
            raise HarnessError(f"the {name!r} server was not started: {available:.1f} GiB of memory available for "
                               f"{timeout_s:.0f} s, {need_gib:.1f} GiB needed (a server takes about {SERVER_GIB} GiB); "
                               "end other work on this machine, or run fewer test workers (-n 1)")
        time.sleep(2.0)


def set_step_slowdown(server: ServerInfo, text: str) -> None:
    """Switch `server`'s test-only step slowdown (patches/model_paths/step_slowdown.py: `decode=0.2`, `prefill=0.3`,
    `0.15`; empty: none) by replacing its file, which its engine reads before each step."""
    if not server.slowdown_file:
        raise ValueError(f"{server.base_url} has no step slowdown file: only a session's embedded servers do")
    path = Path(server.slowdown_file)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# The warm-ups the paired gates measure after, by server (STEADY_PREFIX_CACHE: every arm compares in the same cache
# state). `make test` runs them during its parallel run.
WARMUPS: dict[str, tuple[Warmup, ...]] = {SESSION: (STEADY_PREFIX_CACHE,), TWIN: (STEADY_PREFIX_CACHE,),
                                          REFERENCE: (STEADY_PREFIX_CACHE,)}


def warm_for_gates(servers: dict[str, ServerInfo], out_root: Path) -> list[str]:
    """Run WARMUPS on the servers of `servers` (by name) that have not had them, one after another (every
    server's worker shares one core); returns the warm-ups run now, as `server: warm-up`."""
    done = []
    for name, warmups in WARMUPS.items():
        if name not in servers:
            continue
        for warmup in warmups:
            with exclusive(servers[name]):
                if warm(servers[name], warmup, out_root / name):
                    done.append(f"{name}: {warmup.name}")
    return done


@contextlib.contextmanager
def exclusive(server: ServerInfo) -> Iterator[None]:
    """Hold `server` for one test's requests, across pytest-xdist workers (a lock file beside its log, not the
    one shared_server.acquire takes to start it): the users of a server that need their requests to be the only
    ones in flight (the MoE test's sequential T=1 decodes, the warm-ups, the paired gates) take turns."""
    if not server.log_path:
        raise ValueError(f"{server.base_url}: no log path, so no lock beside it (not a server this session started)")
    with open(Path(server.log_path).with_suffix(".hold"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
