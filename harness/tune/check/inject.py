"""A slowdown of known size in a registered path, for proving what the GPU perf gate catches
(`qwen36 tune --check --inject-delay triton_decode=2`). Test-only: it changes nothing on disk and only the
process that asks for it.

On a GPU the delay is `torch.cuda._sleep`: a kernel that spins for a set number of clock cycles, launched on
the path's stream before the path, so it is inside the eager call and inside a captured graph alike. Cycles
per microsecond are measured once with CUDA events. On a CPU the host spins.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time

import torch

from model.gdn import GDN_RULE_PATHS
from model.moe import EXPERT_PATHS

__all__ = ["InjectError", "parse_injections", "injected_delays"]


class InjectError(ValueError):
    """An --inject-delay the check cannot use; the message names it and the fix."""


def parse_injections(specs: list[str]) -> dict[str, float]:
    """["triton_decode=2", "fla_recurrent=1.5"] -> {path: microseconds}."""
    known = sorted({p.name for p in EXPERT_PATHS.candidates()} | {p.name for p in GDN_RULE_PATHS.candidates()})
    out = {}
    for spec in specs:
        name, eq, us = spec.partition("=")
        try:
            value = float(us) if eq else -1.0
        except ValueError:
            value = -1.0
        if value <= 0 or name not in known:
            raise InjectError(f"--inject-delay {spec!r}: give PATH=MICROSECONDS with PATH one of {known} and a "
                              "positive delay, e.g. triton_decode=2")
        out[name] = value
    return out


@functools.lru_cache(maxsize=None)
def _cycles_per_us(index: int) -> float:
    device = torch.device("cuda", index)
    torch.cuda._sleep(1000)  # load the kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    torch.cuda.synchronize(device)
    return cycles / (start.elapsed_time(end) * 1e3)


def _delay(us: float):
    def wait(device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda._sleep(int(us * _cycles_per_us(device.index or 0)))
        else:
            deadline = time.perf_counter() + us * 1e-6
            while time.perf_counter() < deadline:
                pass
    return wait


def _delayed(fn, wait, device_of):
    @functools.wraps(fn)
    def slowed(*args, **kwargs):
        wait(device_of(args))
        return fn(*args, **kwargs)
    return slowed


@contextlib.contextmanager
def injected_delays(delays: dict[str, float]):
    """While open, each named path in its registry is one that waits `us` first; yields what was done, for the
    report. The registries are process-wide (the check's sweeps, the MoE block and the GDN layer all see the
    delay), so the originals are put back on the way out, on error too."""
    originals, done = [], []
    try:
        for name, us in delays.items():
            table = EXPERT_PATHS if name in EXPERT_PATHS else GDN_RULE_PATHS
            path = table[name]
            originals.append((table, name, path))
            table[name] = dataclasses.replace(path, fn=_delayed(path.fn, _delay(us), lambda args: args[0].device))
            done.append(f"{name}: +{us:g} us before every call (injected, test-only)")
        yield done
    finally:
        for table, name, path in reversed(originals):
            table[name] = path
