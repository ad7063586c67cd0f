"""The norm property (tests/numerics/test_norm.py) for the Triton norm paths, on the CPU through Triton's interpreter.

Not collected by the suite itself (the file name does not start with `test_`): the interpreter must be
chosen before triton is imported, so test_norm_triton_interpreter.py runs this module in a subprocess with
TRITON_INTERPRET=1. Run it by hand the same way:

    TRITON_INTERPRET=1 python -m pytest tests/numerics/norm_interpreter_checks.py -p no:xdist
"""
from __future__ import annotations

import pytest
import torch

from model.dispatch.paths import LOW_PRECISION
from model.norm import triton_rms_norm as norm_triton
from model.norm.rms_norm import GATED_NORM_PATHS, RMS_NORM_PATHS, gated_rms_norm_reference, rms_norm_reference
from model.tolerances import NORM_PATHS
from tests.numerics.compare import assert_close
from tests.numerics.test_norm import EPS, NormCase, check_norm_path, edge_cases

TABLES = {"zero_centred": RMS_NORM_PATHS, "gated": GATED_NORM_PATHS}
DTYPE_IDS = {d: str(d).removeprefix("torch.") for d in LOW_PRECISION}
# For very negative z the interpreter's numpy exp(-z) overflows to inf on purpose (sigmoid -> 0).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


def _launch_edges(dtype: torch.dtype) -> tuple[NormCase, ...]:
    """Shapes at the kernels' launch boundaries: 35 rows of H = 128 (16 rows a program, the last program
    partly masked), the real hidden size, and the largest row a program holds (norm_triton.MAX_HIDDEN)."""
    name = DTYPE_IDS[dtype]
    return (
        NormCase((5, 7), 128, name, "same", 0, 0.3, True, 10),
        NormCase((3,), 2048, name, "float32", 0, 0.3, False, 11),
        NormCase((1,), norm_triton.MAX_HIDDEN, name, "same", 0, 0.0, False, 12),
    )


def test_kernels_run_through_the_interpreter_on_cpu():
    assert norm_triton.INTERPRETED, "TRITON_INTERPRET=1 was not in effect when model.norm.triton_rms_norm was imported"
    for table in TABLES.values():
        path = table["triton"]
        assert all(path.supports(1, dtype, "cpu") for dtype in LOW_PRECISION)
        assert not path.supports(1, torch.float64, "cpu"), "the Triton norms have no float64 kernel"
        assert not path.supports(1, torch.float32, "cuda"), "interpreted kernels claim a GPU"


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("kind", sorted(TABLES))
def test_triton_path_equals_float64_reference(kind, dtype):
    check_norm_path(
        kind, TABLES[kind]["triton"].fn, dtype, NORM_PATHS["triton"][dtype],
        examples=edge_cases(dtype) + _launch_edges(dtype),
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")  # numpy: inf * 0
@pytest.mark.parametrize("kind", sorted(TABLES))
def test_zero_and_non_finite_rows_behave_as_the_reference(kind):
    """rsqrt(0 + eps) is finite, so a zero row is zeros; a NaN poisons its row, an inf gives NaN where it is
    and zeros beside it (x * rsqrt(inf) = x * 0), as in the reference; no row leaks into another (rows are
    independent, and the rows one program holds are masked apart)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40, generator=gen)
    z = torch.randn(6, 40, generator=gen)
    w = 1.0 + 0.3 * torch.randn(40, generator=gen)
    x[1] = 0.0
    x[3, 5] = float("nan")
    x[4, 7] = float("inf")
    if kind == "gated":
        out = GATED_NORM_PATHS["triton"].fn(x, w, EPS, z)
        ref = gated_rms_norm_reference(x.double(), w.double(), EPS, z.double())
    else:
        out = RMS_NORM_PATHS["triton"].fn(x, w, EPS)
        ref = rms_norm_reference(x.double(), w.double(), EPS)
    assert torch.equal(out[1], torch.zeros(40)), out[1]
    assert out[3].isnan().all(), "a NaN input must poison its row"
    assert torch.equal(out.isnan(), ref.isnan()), "NaN where the reference has none, or none where it has"
    assert_close(out.nan_to_num(), ref.nan_to_num(), NORM_PATHS["triton"][torch.float32], f"{kind}: the rest")


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_empty_input_gives_an_empty_output(kind):
    x = torch.empty(0, 3, 16, dtype=torch.bfloat16)
    w = torch.ones(16, dtype=torch.bfloat16)
    args = (x, w, EPS, x.clone()) if kind == "gated" else (x, w, EPS)
    out = TABLES[kind]["triton"].fn(*args)
    assert out.shape == x.shape and out.dtype == x.dtype


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_refuses_what_the_kernels_cannot_compute(kind):
    fn = TABLES[kind]["triton"].fn

    def call(x, w):
        return fn(x, w, EPS, torch.ones_like(x)) if kind == "gated" else fn(x, w, EPS)

    with pytest.raises(TypeError, match="not torch.float64; use the 'fused' path"):
        call(torch.ones(2, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64))
    wide = norm_triton.MAX_HIDDEN + 1
    with pytest.raises(ValueError, match=f"H <= {norm_triton.MAX_HIDDEN}, not {wide}; use the 'fused' path"):
        call(torch.ones(1, wide), torch.ones(wide))
    with pytest.raises(ValueError, match="weight has shape"):
        call(torch.ones(2, 8), torch.ones(9))
