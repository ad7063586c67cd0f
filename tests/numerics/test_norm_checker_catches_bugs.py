"""The norm property (tests/numerics/test_norm.py `check_norm_path`, which every norm path, the Triton ones
included, is held to) can fail: deliberately wrong norms must be reported, with a counterexample shrunk to
the input dimension that exposes each bug.

If one of these tests fails, the property has lost the power to catch that class of bug.
"""
from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, settings

from model.norm.rms_norm import gated_rms_norm_fused, rms_norm_fused
from model.tolerances import NORM_PATHS
from tests.numerics.test_norm import check_norm_path

F32, BF16 = torch.float32, torch.bfloat16
# Failures are expected here: no example database (they must not replay in other tests), fixed seed.
FALSIFY = settings(max_examples=300, derandomize=True, database=None, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow])


def forgets_the_one_plus(x, weight, eps):
    """The zero-centred weight used as a plain weight: x_hat * w instead of x_hat * (1 + w)."""
    xc = x.float()
    return (xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def eps_outside_the_root(x, weight, eps):
    """x / (sqrt(mean(x^2)) + eps): equal to the norm except where mean(x^2) is near eps or below it."""
    xc = x.float()
    return (xc / (xc.pow(2).mean(-1, keepdim=True).sqrt() + eps) * (1.0 + weight.float())).to(x.dtype)


def one_rms_for_the_whole_tensor(x, weight, eps):
    """The mean of squares over every element instead of each row: right only for a single row."""
    xc = x.float()
    return (xc * torch.rsqrt(xc.pow(2).mean() + eps) * (1.0 + weight.float())).to(x.dtype)


def reads_rows_as_if_contiguous(x, weight, eps):
    """A kernel launch that ignores the row stride: reads x's storage as if the rows were packed."""
    packed = torch.as_strided(x, x.shape, torch.empty(x.shape).stride(), x.storage_offset())
    return rms_norm_fused(packed, weight, eps)


def gate_before_the_norm(x, weight, eps, z):
    """Normalises x * silu(z) (vLLM's norm_before_gate=False) where Qwen3.6 normalises x, then gates."""
    gated = x.float() * F.silu(z.float())
    return (gated * torch.rsqrt(gated.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def gated_with_the_zero_centred_weight(x, weight, eps, z):
    """The gated norm's plain weight taken as zero-centred: (1 + w) * x_hat * silu(z)."""
    return gated_rms_norm_fused(x, 1.0 + weight, eps, z)


def falsifying_report(excinfo) -> str:
    report = "\n".join(getattr(excinfo.value, "__notes__", [])) + str(excinfo.value)
    # Hypothesis titles its report "Falsifying example" (older) or "Failing test case" (newer).
    assert re.search(r"Falsifying example|Failing test case", report), f"no hypothesis report in:\n{report}"
    return report


def shrunk_field(report: str, pattern: str) -> str:
    """The value of a NormCase field in the report (the shrunk case: its failure is the one re-raised)."""
    found = re.findall(pattern, report)
    assert found, f"no {pattern!r} in the falsifying example:\n{report}"
    return found[-1]


def rejected(kind, wrong, dtype) -> str:
    """The falsifying report of the property run on a wrong norm (which must fail it)."""
    with pytest.raises(AssertionError) as excinfo:
        check_norm_path(kind, wrong, dtype, NORM_PATHS["triton"][dtype], run_settings=FALSIFY)
    return falsifying_report(excinfo)


def test_a_norm_that_forgets_the_one_plus_is_caught_on_a_single_element():
    report = rejected("zero_centred", forgets_the_one_plus, F32)
    assert shrunk_field(report, r"leading=\(([^)]*)\)") == "" and shrunk_field(report, r"hidden=(\d+)") == "1", report


def test_eps_outside_the_root_is_caught_at_a_tiny_scale():
    """In bf16 the slip is under the bound for ordinary inputs: only the tiny magnitudes catch it."""
    report = rejected("zero_centred", eps_outside_the_root, BF16)
    assert int(shrunk_field(report, r"log10_scale=(-?\d+)")) < 0, report


def test_one_rms_for_the_whole_tensor_is_caught_with_two_rows():
    report = rejected("zero_centred", one_rms_for_the_whole_tensor, F32)
    leading = shrunk_field(report, r"leading=\(([^)]*)\)")
    assert math.prod(int(n) for n in leading.split(",") if n.strip()) >= 2, report


def test_ignoring_the_row_stride_is_caught_on_a_strided_input():
    report = rejected("zero_centred", reads_rows_as_if_contiguous, F32)
    assert shrunk_field(report, r"strided=(True|False)") == "True", report


@pytest.mark.parametrize("wrong", [gate_before_the_norm, gated_with_the_zero_centred_weight],
                         ids=["gate_before_norm", "zero_centred_weight"])
def test_a_wrong_gated_norm_is_caught(wrong):
    rejected("gated", wrong, F32)
