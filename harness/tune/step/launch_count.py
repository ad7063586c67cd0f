"""Kernel launches of a model call, by block kind, counted on any device (a CPU included).

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

__all__ = ["LaunchCounter", "count_launches"]



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
