"""Kernel launches of a model call, by block kind, counted on any device (a CPU included); and the launches of
one call on the device it runs on, as the GPU perf gate records and judges them exactly.

At decode an eager step's time is mostly the host's cost of launching kernels, so the number of launches per
block is the figure to hold down. torch.profiler counts CUDA kernels on a GPU (harness/tune/step/run.py); this counts
what the code asks for, wherever it runs:
- every ATen op that computes (views, aliases and bare allocations excluded), seen by a TorchDispatchMode;
- every Triton launch: through the JIT, through the CPU interpreter (TRITON_INTERPRET=1), or a prepared launch
  (model.dispatch.triton_launch). The ATen ops the interpreter runs inside a launch are not counted.

For a path built of GEMMs and Triton kernels the count is its CUDA kernel count. A composite torch op counts as
the ops it dispatches to on this device: on a CPU `F.rms_norm` is five, where CUDA may run a fused kernel.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.serving.step_profile import NO_KERNEL  # allocations and metadata; views by OpOverload.is_view
from model.dispatch import triton_launch

__all__ = ["LaunchCounter", "count_launches", "count_device_work", "launches_of_call", "launches_of_replay"]



class LaunchCounter(TorchDispatchMode):
    """Counts launches by the block kind named last to `trace(kind)` (model.qwen36's trace hook); `other` outside
    any block. Use as a context manager around the call, with `trace` passed to the model."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()
        self._kinds = ["other"]
        self._in_triton = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._in_triton and not func.is_view and func.overloadpacket.__name__ not in NO_KERNEL:
            self.counts[self._kinds[-1]] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def trace(self, kind: str) -> Iterator[None]:
        """The model's trace hook: launches inside belong to `kind` (prepared Triton launches too)."""
        self._kinds.append(kind)
        before = triton_launch.direct_launches()
        try:
            yield
        finally:
            self.counts[kind] += triton_launch.direct_launches() - before
            self._kinds.pop()

    @contextlib.contextmanager
    def _triton_launches(self) -> Iterator[None]:
        """Count each launch through the JIT or the interpreter, and ignore the ATen ops inside it."""
        patched = []
        for cls in _launchers():
            original = cls.run

            def run(fn_self, *args, _original=original, **kwargs):
                if kwargs.get("warmup"):
                    return _original(fn_self, *args, **kwargs)
                self.counts[self._kinds[-1]] += 1
                self._in_triton += 1
                try:
                    return _original(fn_self, *args, **kwargs)
                finally:
                    self._in_triton -= 1

            cls.run = run
            patched.append((cls, original))
        try:
            yield
        finally:
            for cls, original in patched:
                cls.run = original

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self._triton_launches())
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._stack.close()


def _launchers() -> list[type]:
    """Triton's launch entry points that are importable here (none without Triton)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        return []
    return [JITFunction, InterpretedFunction]


def count_launches(call: Callable[[Callable[[str], contextlib.AbstractContextManager]], object]) -> dict[str, int]:
    """Launches by block kind of `call(trace)`, which runs the model with `trace` as its trace hook."""
    counter = LaunchCounter()
    with torch.no_grad(), counter:
        call(counter.trace)
    return dict(counter.counts)


def count_device_work(events) -> dict[str, int]:
    """Kernels, copies and fills among a profile's device-side events (torch.profiler FunctionEvents): by
    kineto's activity type where the torch build records it, else by the names CUPTI gives copies and fills."""
    from torch.autograd import DeviceType

    counts = {"kernels": 0, "memcpy": 0, "memset": 0}
    for e in events:
        if e.device_type != DeviceType.CUDA:
            continue
        activity, name = getattr(e, "activity_type", None) or "", e.name.lower()
        if activity == "gpu_memcpy" or (not activity and name.startswith("memcpy")):
            counts["memcpy"] += 1
        elif activity == "gpu_memset" or (not activity and name.startswith("memset")):
            counts["memset"] += 1
        elif activity in ("", "kernel"):  # not annotations or other device-side markers
            counts["kernels"] += 1
    return counts


def launches_of_call(run: Callable[[], object], device: torch.device) -> dict[str, int]:
    """What one call of `run` launches where it runs. CUDA: the kernels, copies and fills torch.profiler sees
    on the device ({"kernels", "memcpy", "memset"}). Elsewhere: {"ops": every ATen op that computes and every
    Triton launch} (LaunchCounter), the count a CPU can take of the same code."""
    if device.type != "cuda":
        return {"ops": sum(count_launches(lambda trace: run()).values())}
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize(device)
    return count_device_work(prof.events())


def launches_of_replay(replay: Callable[[], object], device: torch.device) -> dict[str, int] | None:
    """The kernels, copies and fills one CUDA graph replay runs (CUPTI reports a graph's kernels one by one);
    None when the profiler saw none, which a replay of real work cannot be (a build whose CUPTI hides graph
    kernels: not counted rather than counted as zero)."""
    counts = launches_of_call(replay, device)
    return counts if sum(counts.values()) else None
