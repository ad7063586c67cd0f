"""Host wall time per eager call on CUDA, for the gpu-marked tests that report it: what an eager decode step
pays for a block, its launches included (no L2 flush; `qwen36 tune` is the measurement that gates)."""
from __future__ import annotations

import time
from typing import Callable

import torch

__all__ = ["eager_wall_us"]


def eager_wall_us(fn: Callable[[], object], calls: int = 200, warmup: int = 10) -> float:
    """Microseconds per call of `calls` back-to-back calls after `warmup` untimed ones, synchronised around."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6
