"""Prepared Triton launches (model/dispatch/triton_launch.py): the bookkeeping, against a stand-in kernel that records
what it was called with. Whether a real compiled kernel launched this way computes what the JIT computes is
tests/numerics/test_triton_launch_gpu.py's question (it needs CUDA)."""
from __future__ import annotations

import gc
import inspect

import pytest

pytest.importorskip("triton")

from model.dispatch import triton_launch  # noqa: E402
from model.dispatch.triton_launch import LaunchPlan, PlansByOwner, PreparedLaunch  # noqa: E402


class _Param:
    def __init__(self, p: inspect.Parameter):
        self.default = p.default


class StandInKernel:
    """Looks like a JITFunction to PreparedLaunch: `kernel[grid](*args, **meta)` records the call and returns a
    stand-in compiled kernel (or None, as Triton's interpreter does)."""

    def __init__(self, compiles: bool = True):
        def signature(a, b, n, BLOCK, FLAG=True, TAIL=7):  # BLOCK, FLAG and TAIL play the constexprs
            pass

        params = inspect.signature(signature).parameters
        self.arg_names = list(params)
        self.constexprs = [3, 4, 5]
        self.params = [_Param(p) for p in params.values()]
        self.compiles = compiles
        self.jit_calls: list[tuple] = []
        self.direct_calls: list[tuple] = []

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.jit_calls.append((grid, args, meta))
            return _StandInCompiled(self) if self.compiles else None
        return run


class _StandInCompiled:
    packed_metadata = object()

    def __init__(self, kernel: StandInKernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *args: self.kernel.direct_calls.append((grid, args))


def test_the_first_call_takes_the_jit_and_later_ones_the_compiled_kernel_with_constexprs_in_place():
    kernel = StandInKernel()
    launch = PreparedLaunch(kernel, (5,), {"BLOCK": 64, "num_warps": 4})
    before = triton_launch.direct_launches()
    launch("A", "B", 10)
    assert kernel.jit_calls == [((5,), ("A", "B", 10), {"BLOCK": 64, "num_warps": 4})]
    launch("A2", "B2", 11)
    launch("A3", "B3", 12)
    assert len(kernel.jit_calls) == 1
    # Every parameter in signature order: the constexprs at their places (FLAG and TAIL from their defaults),
    # the grid padded to three dims; num_warps is compiled in and not an argument.
    assert kernel.direct_calls == [((5, 1, 1), ("A2", "B2", 11, 64, True, 7)),
                                   ((5, 1, 1), ("A3", "B3", 12, 64, True, 7))]
    assert triton_launch.direct_launches() == before + 2


def test_without_a_compiled_kernel_every_call_takes_the_jit():
    kernel = StandInKernel(compiles=False)  # Triton's interpreter
    launch = PreparedLaunch(kernel, (2, 3), {"BLOCK": 8})
    for i in range(3):
        launch("a", "b", i)
    assert [c[1] for c in kernel.jit_calls] == [("a", "b", 0), ("a", "b", 1), ("a", "b", 2)]
    assert kernel.direct_calls == []


def test_a_launch_hook_sends_calls_through_the_jit_so_profilers_see_them(monkeypatch):
    kernel = StandInKernel()
    launch = PreparedLaunch(kernel, (1,), {"BLOCK": 8})
    launch("a", "b", 1)
    monkeypatch.setattr(triton_launch.knobs.runtime, "launch_enter_hook", lambda *a: None)
    launch("a", "b", 2)
    assert len(kernel.jit_calls) == 2 and kernel.direct_calls == []


def test_an_empty_hook_chain_is_no_hook():
    class Chain:  # newer Triton keeps a chain of hooks, empty when none is set
        def __init__(self, calls):
            self.calls = calls

    assert not triton_launch._hook_set(None) and not triton_launch._hook_set(Chain([]))
    assert triton_launch._hook_set(Chain([print])) and triton_launch._hook_set(lambda *a: None)


def test_a_plan_keeps_one_launch_per_kernel_grid_and_meta():
    kernel = StandInKernel()
    plan = LaunchPlan()
    first = plan(kernel, (4,), {"BLOCK": 8})
    assert plan(kernel, (4,), {"BLOCK": 8}) is first
    assert plan(kernel, (8,), {"BLOCK": 8}) is not first  # another grid is another launch
    assert plan(kernel, (4,), {"BLOCK": 16}) is not first  # another constexpr too
    assert plan(StandInKernel(), (4,), {"BLOCK": 8}) is not first


class Owner:
    pass


def test_plans_belong_to_their_owner_and_die_with_it():
    plans = PlansByOwner()
    a, b = Owner(), Owner()
    plans.of(a)["k"] = "plan of a"
    assert plans.of(a) == {"k": "plan of a"}
    assert plans.of(b) == {}
    del a
    gc.collect()
    assert len(plans._by_id) == 1  # a's entry went with a
    # Objects made after a died, possibly at its address, start without plans.
    assert all(plans.of(Owner()) == {} for _ in range(50))
