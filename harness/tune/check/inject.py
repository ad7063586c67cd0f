"""A slowdown of known size in a registered path, for proving what the GPU perf gate catches
(`qwen36 tune --check --inject-delay triton_decode=2`, `--inject-delay moe_block:triton_fused_block=1.5`). Test-only: it changes nothing on disk and only the
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

from model.attention.decode_layer import ATTENTION_DECODE_LAYER_PATHS
from model.gdn import GDN_RULE_PATHS
from model.gdn.conv import CONV_PATHS
from model.gdn.decode_layer import GDN_DECODE_LAYER_PATHS
from model.moe import EXPERT_PATHS, MOE_BLOCK_PATHS
from model.norm.rms_norm import ADD_RMS_NORM_PATHS, GATED_NORM_PATHS

from ..measure.timing import busy_wait

__all__ = ["InjectError", "parse_injections", "injected_delays"]


class InjectError(ValueError):
    """An --inject-delay the check cannot use; the message names it and the fix."""


# The registries a delay can go into, by the dispatch block that chooses from each (the name a table uses).
REGISTRIES = {"moe_experts": EXPERT_PATHS, "gdn_rule": GDN_RULE_PATHS, "moe_block": MOE_BLOCK_PATHS,
              "gdn_layer_decode": GDN_DECODE_LAYER_PATHS, "gdn_conv": CONV_PATHS, "gdn_gated_norm": GATED_NORM_PATHS,
              "add_rms_norm": ADD_RMS_NORM_PATHS, "attention_layer_decode": ATTENTION_DECODE_LAYER_PATHS}


def _known() -> dict[str, list[str]]:
    return {block: sorted(p.name for p in table.candidates()) for block, table in REGISTRIES.items()}


def parse_injections(specs: list[str]) -> dict[tuple[str, str], float]:
    """["triton_decode=2", "moe_block:triton_fused_block=1.5"] -> {(block, path): microseconds}. A path name
    that one registry alone holds needs no block; `triton` (several) does."""
    known = _known()
    out = {}
    for spec in specs:
        target, eq, us = spec.partition("=")
        block, colon, name = target.rpartition(":")
        try:
            value = float(us) if eq else -1.0
        except ValueError:
            value = -1.0
        holders = [b for b, names in known.items() if name in names and (not colon or b == block)]
        if value <= 0 or len(holders) != 1:
            why = (f"{name!r} is a path of {', '.join(holders)}: name one as BLOCK:{name}" if len(holders) > 1
                   else "no registered path of that name" if value > 0 else "no positive delay")
            raise InjectError(f"--inject-delay {spec!r}: {why}; give [BLOCK:]PATH=MICROSECONDS, e.g. triton_decode=2 "
                              f"or moe_block:triton_fused_block=1.5, with BLOCK:PATH one of "
                              f"{', '.join(f'{b}:{n}' for b, names in known.items() for n in names)}")
        out[(holders[0], name)] = value
    return out


def _delay(us: float):
    def wait(device: torch.device) -> None:
        if device.type == "cuda":
            busy_wait(device, us)
        else:
            deadline = time.perf_counter() + us * 1e-6
            while time.perf_counter() < deadline:
                pass
    return wait


def _device_of(args, kwargs) -> torch.device:
    """The device of the call's first tensor argument (every path takes its input first, or among the first)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _delayed(fn, wait):
    @functools.wraps(fn)
    def slowed(*args, **kwargs):
        wait(_device_of(args, kwargs))
        return fn(*args, **kwargs)
    return slowed


@contextlib.contextmanager
def injected_delays(delays: dict[tuple[str, str], float]):
    """While open, each named path in its registry is one that waits `us` first; yields what was done, for the
    report. The registries are process-wide (the check's sweeps, the MoE block and the GDN layer all see the
    delay), so the originals are put back on the way out, on error too."""
    originals, done = [], []
    try:
        for (block, name), us in delays.items():
            table = REGISTRIES[block]
            path = table[name]
            originals.append((table, name, path))
            table[name] = dataclasses.replace(path, fn=_delayed(path.fn, _delay(us)))
            done.append(f"{block}:{name}: +{us:g} us before every call (injected, test-only; on a GPU one more launch)")
        yield done
    finally:
        for table, name, path in reversed(originals):
            table[name] = path
