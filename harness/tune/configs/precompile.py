"""Compiling the config sweep's candidates in parallel processes before it times them.

Triton compiles a config the first time it runs, one after another in the sweep's process: the ~150
candidates take minutes. Spawned workers (CUDA cannot be forked) each run a contiguous share of them once,
so the compiled kernels land in Triton's on-disk cache, which the sweep then reads. The lists vary the down
kernel fastest, so configs that share a gate-up kernel mostly land in one worker and compile it once.
Best effort: a config that fails here fails again in the sweep, where it is reported per point; a pool that
cannot start leaves the compiling to the sweep.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import torch

from ..measure.dims import MoEDims
from ..measure.inputs import moe_hidden, moe_routing, moe_weights

__all__ = ["precompile"]


def precompile(configs: dict[str, list], tokens: dict[str, int], d: MoEDims, dtype: torch.dtype,
               device: torch.device, workers: int) -> str:
    """Run each kernel's configs (Triton path -> configs) once at its token count; returns a line for the notes."""
    workers = max(1, min(workers, os.cpu_count() or 1))
    jobs = [(path, chunk, tokens[path], d, dtype, str(device))
            for path, cs in configs.items() for chunk in _chunks(cs, workers)]
    total = sum(len(cs) for cs in configs.values())
    start = time.monotonic()
    try:
        with mp.get_context("spawn").Pool(workers) as pool:
            failed = sum(pool.map(_compile, jobs))
    except Exception as exc:
        return (f"precompiling in {workers} processes failed ({type(exc).__name__}: {str(exc).strip()[:200]}); "
                f"each config compiled as the sweep reached it")
    return (f"precompiled {total} configs in {workers} processes in {time.monotonic() - start:.0f} s; "
            f"{failed} failed there (their errors are reported per point)")


def _chunks(items: list, n: int) -> list[list]:
    size = -(-len(items) // n)
    return [items[i : i + size] for i in range(0, len(items), size)]


def _compile(job) -> int:
    """In a worker: run each config once; returns how many raised."""
    path, configs, tokens, d, dtype, device = job
    from .space import triton_kernel  # imports triton, as the sweep does

    kernel, device = triton_kernel(path), torch.device(device)
    w = moe_weights(d, dtype, device)
    x = moe_hidden(tokens, d, dtype, device, seed=tokens)
    weights, ids = moe_routing(x, w)
    out = torch.empty_like(x)
    failed = 0
    for config in configs:
        try:
            kernel.run(x, w.w13, w.w2, weights, ids, out, config=config)
        except Exception:  # e.g. a tile that needs more shared memory than the SM has
            failed += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a launch that fails late counts here, not in the sweep's first call
    return failed
