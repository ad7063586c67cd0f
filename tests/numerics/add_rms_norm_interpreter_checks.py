"""The residual add + RMSNorm property (tests/numerics/test_add_rms_norm.py) for the `triton` path, on the CPU
through Triton's interpreter: both outputs bit for bit torch's `h + y` and model.norm.triton_rms_norm's one-launch
RMSNorm of that sum, and within the norm tolerances of the float64 reference; and the same property rejecting
deliberately broken kernels.

Not collected by the suite itself (the file name does not start with `test_`): the interpreter must be chosen
before triton is imported, so test_add_rms_norm_triton_interpreter.py runs this module in a subprocess with
TRITON_INTERPRET=1. Run it by hand the same way:

    TRITON_INTERPRET=1 python -m pytest tests/numerics/add_rms_norm_interpreter_checks.py -p no:xdist

The interpreter casts float32 to bfloat16 by truncation where CUDA rounds to nearest; the kernel rounds the sum
itself (as torch does, bit for bit on both), and its normed output keeps the cast the RMSNorm kernel has, so
the bit equality holds under the interpreter as it does compiled (test_add_rms_norm_gpu.py).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from model.dispatch.paths import LOW_PRECISION
from model.norm import triton_rms_norm as norm_triton
from model.norm.rms_norm import ADD_RMS_NORM_PATHS, rms_norm_reference
from model.tolerances import ADD_NORM_PATHS
from tests.numerics.compare import assert_close
from tests.numerics.kernel_mutants import FALSIFY, load_mutant
from tests.numerics.test_add_rms_norm import (
    EPS,
    AddNormCase,
    bit_differences,
    check_add_norm_path,
    edge_cases,
    same_bits,
)

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
PATH = ADD_RMS_NORM_PATHS["triton"]
DTYPE_IDS = {d: str(d).removeprefix("torch.") for d in LOW_PRECISION}


def torch_then_rms_norm_triton(h, y, weight, eps):
    """What the `triton` path must equal bit for bit: torch's `h + y`, then the one-launch RMSNorm of that sum."""
    s = h + y
    return s, norm_triton.zero_centred_rms_norm(s, weight, eps)


def _launch_edges(dtype: torch.dtype) -> tuple[AddNormCase, ...]:
    """Shapes at the kernel's launch boundaries: 35 rows of H = 128 (16 rows a program, the last program partly
    masked), h and y with different row strides, the real hidden size, and the largest row a program holds."""
    name = DTYPE_IDS[dtype]
    return (
        AddNormCase((5, 7), 128, name, "same", 0, 0, False, True, False, 10),
        AddNormCase((3,), 1000, name, "float32", 0, 0, True, False, True, 11),
        AddNormCase((3,), 2048, name, "same", 0, -1, False, False, False, 12),
        AddNormCase((1,), norm_triton.MAX_HIDDEN, name, "same", 0, 0, False, False, False, 13),
    )


def test_kernel_runs_through_the_interpreter_on_cpu():
    assert norm_triton.INTERPRETED, "TRITON_INTERPRET=1 was not in effect when model.norm.triton_rms_norm was imported"
    assert all(PATH.supports(1, dtype, "cpu") for dtype in LOW_PRECISION)
    assert not PATH.supports(1, torch.float64, "cpu"), "the Triton residual add has no float64 kernel"
    assert not PATH.supports(1, F32, "cuda"), "interpreted kernels claim a GPU"


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=DTYPE_IDS.get)
def test_triton_path_is_torch_bit_for_bit_and_within_the_float64_reference(dtype):
    check_add_norm_path(PATH.fn, dtype, ADD_NORM_PATHS["triton"][dtype],
                        examples=edge_cases(dtype) + _launch_edges(dtype),
                        bits_against=torch_then_rms_norm_triton, contiguous=True)


def _rounding_pairs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y) rows whose float32 sums sit on and beside `dtype`'s rounding boundaries: exact ties (to even up
    and down, both signs), a tie at the largest finite value (rounds to inf), signed zeros, exact cancellation,
    overflow, and subnormal sums; then every pair of 24 values 2^-12 .. 2^12 apart. Every input is normal:
    the interpreter's bfloat16 -> float32 cast loses bfloat16 subnormals (CUDA's does not), and the property's
    magnitudes never reach them."""
    info = torch.finfo(dtype)
    ulp1 = info.eps  # the spacing at 1
    top_half_ulp = 2.0 ** math.floor(math.log2(info.max)) * ulp1 / 2  # max + this is a tie, rounding to inf
    specials = [
        (1.0, ulp1 / 2), (1.0 + ulp1, ulp1 / 2), (-1.0, -ulp1 / 2), (-(1.0 + ulp1), -ulp1 / 2),
        (1.0, ulp1 / 2 + ulp1 / 8), (1.0 + ulp1, ulp1 / 2 - ulp1 / 8), (info.max, top_half_ulp),
        (info.max, top_half_ulp / 2), (-info.max, -top_half_ulp),
        (info.max, info.max), (-info.max, -info.max), (info.max, -info.max), (0.0, -0.0), (-0.0, -0.0),
        (3.0, -3.0), (info.tiny * 1.5, -info.tiny), (info.tiny * (1 + ulp1), -info.tiny),
        (-info.tiny * 1.75, info.tiny), (info.tiny * 3, -info.tiny * (2 - ulp1)),
    ]
    h = torch.tensor([a for a, _ in specials], dtype=torch.float64)
    y = torch.tensor([b for _, b in specials], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    values = (torch.randn(24, generator=gen, dtype=torch.float64) * 2.0 ** torch.randint(-12, 13, (24,), generator=gen))
    values = values.to(dtype).double()
    pairs_h, pairs_y = torch.meshgrid(values, values, indexing="ij")
    return (torch.cat([h, pairs_h.flatten()]).to(dtype)[None], torch.cat([y, pairs_y.flatten()]).to(dtype)[None])


# numpy on the overflowing pairs: inf in the sum, inf * 0 in the norm.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=DTYPE_IDS.get)
def test_the_sum_is_rounded_as_torch_rounds_it_at_the_rounding_edges(dtype):
    h, y = _rounding_pairs(dtype)
    weight = torch.zeros(h.shape[-1], dtype=dtype)
    h_new, normed = PATH.fn(h, y, weight, EPS)
    want = h + y
    assert want.isfinite().sum() < want.numel(), "the edge pairs lost their overflow"
    assert same_bits(h_new, want), f"{dtype}: the sums are not torch's: {bit_differences(h_new, want)}"


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy: inf - inf, inf * 0
def test_zero_and_non_finite_rows_behave_as_the_reference():
    """A zero sum (zeros, or y = -h exactly) normalises to zeros; a NaN in either input poisons its row of normed
    and one element of h_new; an inf sums to inf (NaN beside a -inf) and normalises to NaN where it is and
    zeros beside it, as in the reference; no row leaks into another (one program holds several)."""
    gen = torch.Generator().manual_seed(0)
    h, y = torch.randn(7, 40, generator=gen), torch.randn(7, 40, generator=gen)
    w = 0.3 * torch.randn(40, generator=gen)
    h[1], y[1] = 0.0, 0.0
    y[2] = -h[2]
    y[3, 5] = float("nan")
    h[4, 7] = float("inf")
    h[5, 9], y[5, 9] = float("inf"), float("-inf")
    h_new, normed = PATH.fn(h, y, w, EPS)
    want = h + y
    ref = rms_norm_reference(want.double(), w.double(), EPS)
    assert torch.equal(h_new.isnan(), want.isnan()) and same_bits(h_new.nan_to_num(), want.nan_to_num())
    assert torch.equal(normed[1], torch.zeros(40)) and torch.equal(normed[2], torch.zeros(40)), normed[1:3]
    assert normed[3].isnan().all() and normed[5].isnan().all(), "a NaN sum must poison its row"
    assert torch.equal(normed.isnan(), ref.isnan()), "NaN where the reference has none, or none where it has"
    assert_close(normed.nan_to_num(), ref.nan_to_num(), ADD_NORM_PATHS["triton"][F32], "the rest")


@pytest.mark.parametrize("shape", [(0, 3, 16), (0, 2048), (2, 0, 128)])
def test_empty_input_gives_empty_outputs(shape):
    h = torch.empty(shape, dtype=BF16)
    h_new, normed = PATH.fn(h, h.clone(), torch.ones(shape[-1], dtype=BF16), EPS)
    assert h_new.shape == normed.shape == h.shape and h_new.dtype == normed.dtype == BF16


def test_refuses_what_the_kernel_cannot_compute():
    with pytest.raises(TypeError, match="not torch.float64; use the 'fused' path"):
        PATH.fn(torch.ones(2, 8, dtype=torch.float64), torch.ones(2, 8, dtype=torch.float64), torch.ones(8), EPS)
    wide = norm_triton.MAX_HIDDEN + 1
    with pytest.raises(ValueError, match=f"H <= {norm_triton.MAX_HIDDEN}, not {wide}; use the 'fused' path"):
        PATH.fn(torch.ones(1, wide), torch.ones(1, wide), torch.ones(wide), EPS)
    # The kernel module's own checks, for callers that skip model.norm.rms_norm's.
    with pytest.raises(TypeError, match="adds y of h's dtype torch.float32, not torch.bfloat16"):
        norm_triton.add_zero_centred_rms_norm(torch.ones(2, 8), torch.ones(2, 8, dtype=BF16), torch.ones(8), EPS)
    with pytest.raises(ValueError, match="on one device"):
        norm_triton.add_zero_centred_rms_norm(torch.ones(2, 8), torch.ones(2, 8), torch.ones(8, device="meta"), EPS)


# --- broken kernels: the module's source with one piece changed ----------------------------------------------

MUTANTS = {
    # h_new stored as h: the residual never added to the stream (the norm still sees the sum).
    "residual_not_stored": ("tl.store(h_out_ptr + out_at, h_new, mask=mask)",
                            "tl.store(h_out_ptr + out_at, h.to(h_out_ptr.dtype.element_ty), mask=mask)"),
    # The norm of h, not of h + y (the stored sum is right).
    "norm_of_h": ("normed = _normalised(h_new.to(tl.float32), hidden, eps)", "normed = _normalised(h, hidden, eps)"),
    # The zero-centred weight used as a plain weight: x_hat * w.
    "weight_without_the_one": ("one_plus_w = 1.0 + w", "one_plus_w = w"),
    # The norm of the float32 sum, not of the rounded sum the stream keeps: within every bound, wrong bits.
    "sum_not_rounded_before_the_norm": ("normed = _normalised(h_new.to(tl.float32), hidden, eps)",
                                        "normed = _normalised(h + y, hidden, eps)"),
    # y read with h's row stride: right while both are packed alike, wrong when one is a strided view.
    "y_read_with_the_stride_of_h": ("y_ptr + rows[:, None] * stride_y", "y_ptr + rows[:, None] * stride_h"),
    # Ties rounded away from zero, not to even: off by one ulp on exact ties only.
    "ties_away_from_zero": ("(0x7FFF + ((bits >> 16) & 1))", "0x8000"),
}
# What each mutant must be reported as: all but the rounding ones are grossly wrong.
CAUGHT_AS = {
    "sum_not_rounded_before_the_norm": "normed is not bit for bit",
    "ties_away_from_zero": "h_new is not bit for bit",
}


def _mutant_path(tmp_path: Path, name: str, old: str, new: str):
    module = load_mutant(norm_triton, tmp_path, name, old, new)
    return lambda h, y, weight, eps: module.add_zero_centred_rms_norm(h, y, weight, eps)


# A broken kernel's values can be anything: numpy may warn on the way.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_property_rejects_a_broken_kernel(name, tmp_path):
    old, new = MUTANTS[name]
    with pytest.raises(AssertionError, match=CAUGHT_AS.get(name, "relative error")):
        check_add_norm_path(_mutant_path(tmp_path, name, old, new), BF16, ADD_NORM_PATHS["triton"][BF16],
                            run_settings=FALSIFY, bits_against=torch_then_rms_norm_triton, contiguous=True)


def test_the_unbroken_copy_passes(tmp_path):
    """The mutants fail for their change, not for being loaded from a copy."""
    same = _mutant_path(tmp_path, "none", "import torch\n", "import torch\n")
    check_add_norm_path(same, BF16, ADD_NORM_PATHS["triton"][BF16], run_settings=settings(FALSIFY, max_examples=4),
                        bits_against=torch_then_rms_norm_triton, contiguous=True)
