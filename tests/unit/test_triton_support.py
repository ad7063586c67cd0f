"""The one rule for where this package's Triton kernels run (model/triton_support.py)."""
from __future__ import annotations

import os

import pytest

from model import triton_support


@pytest.mark.parametrize(
    "device, interpreted, runs",
    [("cuda", False, True), ("cuda", True, False), ("cpu", True, True), ("cpu", False, False), ("mps", True, False)],
)
def test_kernels_run_compiled_on_cuda_and_interpreted_on_the_cpu_only(device, interpreted, runs):
    why = triton_support.unavailable_reason(device, interpreted)
    assert (why is None) == runs, why
    if not runs:
        assert "TRITON_INTERPRET=1" in why  # the reason names the switch that decides it


def test_without_triton_every_device_says_so():
    for device in ("cuda", "cpu"):
        assert triton_support.unavailable_reason(device, None) == "Triton is not installed"


@pytest.mark.skipif(triton_support.triton is None, reason="triton is not installed")
def test_a_kernel_defined_here_reports_how_it_was_defined():
    from model.moe import triton_router

    assert triton_support.defined_interpreted(triton_router._route_topk_softmax_kernel) == triton_router.INTERPRETED
    # Triton chose from the environment at definition time.
    assert triton_router.INTERPRETED == (os.environ.get("TRITON_INTERPRET", "0") in ("1", "true", "on"))
