"""Launching a Triton kernel again without the JIT's per-call work.

`kernel[grid](*args)` binds every argument, specialises each one (dtype, 16-byte alignment, ints equal to 1 or
divisible by 16), hashes the result and looks the compiled kernel up: 12-20 µs of host time per launch on the
H200 VMs (tools/launch_cost_probe.py), about as much as the GPU spends on a decode-sized kernel. An eager decode
step pays it for every kernel. `PreparedLaunch` pays it once: its first call goes through the JIT and keeps the
compiled kernel; later calls hand the arguments straight to that kernel's launcher (`CompiledKernel[grid]`, the
entry Triton gives ahead-of-time callers), as torch.compile's generated code does.

That is only right while every call's arguments specialise as the first call's did, so the owner of a
`PreparedLaunch` keys it by everything that decides the specialisation: the tensors' dtypes and alignment and
every int argument (a plan per weights and token count, as model.moe.triton_block keeps). Under Triton's CPU
interpreter (no compiled kernel) and when a launch hook is set (profilers), every call takes the JIT.
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

try:
    from triton import knobs  # Triton 3.4+: where the launch hooks live
except ImportError:  # an older Triton or none: no prepared launches (see _jit_only)
    knobs = None

__all__ = ["LaunchPlan", "PlansByOwner", "PreparedLaunch", "direct_launches", "jit_launch"]

# Launches that skipped the JIT, process-wide: what a test reads to know the prepared route really ran.
_direct = 0


def direct_launches() -> int:
    return _direct


class PreparedLaunch:
    """One Triton kernel at one grid and one set of compile-time values (`meta`: constexprs, num_warps ...).
    Call it with the kernel's runtime arguments in signature order."""

    def __init__(self, kernel, grid: Sequence[int], meta: dict[str, Any]):
        self._kernel, self._grid, self._meta = kernel, tuple(grid), meta
        self._grid3 = tuple(grid) + (1,) * (3 - len(grid))  # the compiled launcher takes all three
        names = getattr(kernel, "arg_names", None)
        constexprs = getattr(kernel, "constexprs", None)
        # The compiled launcher takes every parameter in order, the constexprs included (their values are ignored
        # there, but their places count): the constexpr values go at their signature positions.
        self._constexpr_at = None if names is None or constexprs is None else [
            (i, meta[names[i]] if names[i] in meta else kernel.params[i].default) for i in sorted(constexprs)
        ]
        self._runner = None  # the compiled kernel's launcher, after the first call
        self._jit_only = self._constexpr_at is None or knobs is None

    def __call__(self, *args) -> None:
        if self._runner is not None and not _hooks_set():
            global _direct
            full = list(args)
            for i, value in self._constexpr_at:
                full.insert(i, value)
            self._runner(*full)
            _direct += 1
            return
        compiled = self._kernel[self._grid](*args, **self._meta)
        if self._runner is None and not self._jit_only:
            # A CompiledKernel (CUDA) can be launched again directly; the interpreter returns none.
            getter = getattr(compiled, "__getitem__", None)
            self._runner = getter(self._grid3) if getter is not None and hasattr(compiled, "packed_metadata") else None
            self._jit_only = self._runner is None


def _hooks_set() -> bool:
    return _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook)


def _hook_set(hook) -> bool:
    # Triton 3.6 keeps a hook or None; later versions keep a chain of hooks that is empty when none is set.
    calls = getattr(hook, "calls", None)
    return hook is not None and (calls is None or len(calls) > 0)


def jit_launch(kernel, grid: Sequence[int], meta: dict[str, Any]):
    """The plain route, as a launcher: `jit_launch(kernel, grid, meta)(*args)` is `kernel[grid](*args, **meta)`."""
    return lambda *args: kernel[grid](*args, **meta)


class LaunchPlan:
    """The prepared launches of one call shape, made on first use: `plan(kernel, grid, meta)` is a launcher like
    `jit_launch`'s. Whoever keeps a plan keys it by everything the kernels specialise on (see the module doc)."""

    def __init__(self) -> None:
        self._launches: dict[tuple, PreparedLaunch] = {}

    def __call__(self, kernel, grid: Sequence[int], meta: dict[str, Any]) -> PreparedLaunch:
        key = (kernel, tuple(grid), tuple(meta.items()))
        launch = self._launches.get(key)
        if launch is None:
            launch = self._launches[key] = PreparedLaunch(kernel, grid, meta)
        return launch


class PlansByOwner:
    """Per-object dicts of plans (an owner: a weights object), dropped when the owner is collected. Keyed by
    identity, checked by a weak reference, so a new object at a dead one's address never inherits its plans."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref, dict]] = {}

    def of(self, owner) -> dict:
        entry = self._by_id.get(id(owner))
        if entry is None or entry[0]() is not owner:
            key = id(owner)
            entry = (weakref.ref(owner, lambda _ref, key=key: self._by_id.pop(key, None)), {})
            self._by_id[key] = entry
        return entry[1]
