"""Host wall time per eager call on CUDA, for the gpu-marked tests that report it: what an eager decode step
pays for a block, its launches included (no L2 flush; `qwen36 tune` is the measurement that gates); and where
those tests write their figures (GPU_REPORT_DIR)."""
from __future__ import annotations

import json
import os
import time
from typing import Callable

import torch

__all__ = ["eager_wall_us", "through_the_jit", "write_gpu_report"]


def write_gpu_report(file_name: str, report: dict) -> None:
    """`report` as JSON to $GPU_REPORT_DIR/file_name, with the device and torch version that measured it, when
    the variable is set and anything was measured."""
    report_dir = os.environ.get("GPU_REPORT_DIR")
    if report_dir and any(report.values()):
        os.makedirs(report_dir, exist_ok=True)
        machine = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
        with open(os.path.join(report_dir, file_name), "w") as f:
            json.dump({**report, **machine}, f, indent=2, sort_keys=True)


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


def through_the_jit(fn: Callable[[], object]):
    """fn() with every prepared launch (model.dispatch.triton_launch) taking the JIT instead, as it does while a launch
    hook is set: what a prepared launch must equal, bit for bit."""
    from model.dispatch import triton_launch

    runtime = triton_launch.knobs.runtime
    kept = runtime.launch_enter_hook
    runtime.launch_enter_hook = lambda *args: None
    try:
        return fn()
    finally:
        runtime.launch_enter_hook = kept
