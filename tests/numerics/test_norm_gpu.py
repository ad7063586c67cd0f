"""The Triton norm paths on a CUDA GPU: the norm property at small dims, and at the real per-rank shapes of
Qwen3.6 under TP=4, compiled (not interpreted) against the float64 reference; one kernel launch per call.

Real shapes, rows = tokens in 1, 8, 64, 4096, bf16:
- the residual norms: [rows, 2048];
- the attention q/k norms: q is the first half of each head's 512 columns of the q/gate projection
  ([rows, 4 heads, 256], rows strided), k is [rows, 1 head, 256];
- the GDN gated norm: [rows, 8 value heads, 128], normalised over 128, gated by z of the same shape.
Run with `--hypothesis-profile=gpu -s`; with GPU_REPORT_DIR set, writes the errors and the per-call times
of `triton` and `fused` (eager, host launch cost included) to $GPU_REPORT_DIR/norm_gpu.json.
"""
from __future__ import annotations

import pytest
import torch

from model.dispatch.paths import LOW_PRECISION
from model.norm.rms_norm import GATED_NORM_PATHS, RMS_NORM_PATHS, gated_rms_norm_reference, rms_norm_reference
from model.tolerances import NORM_PATHS
from tests.numerics.compare import assert_close
from tests.numerics.gpu_timing import eager_wall_us, write_gpu_report
from tests.numerics.test_norm import EPS, check_norm_path

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
TABLES = {"zero_centred": RMS_NORM_PATHS, "gated": GATED_NORM_PATHS}
ROWS = (1, 8, 64, 4096)
# name -> (leading dims after the rows, H, row width the input is a slice of)
REAL_SHAPES = {
    "residual": ((), 2048, 2048),
    "q_norm": ((4,), 256, 512),
    "k_norm": ((1,), 256, 256),
    "gdn_gated": ((8,), 128, 128),
}
REPORT: dict = {"errors": {}, "us_per_call": {}}


def _real_inputs(kind: str, shape_name: str, rows: int, seed: int):
    """(x, w, z): w near 0 for the zero-centred norm, near 1 for the gated one (its plain weight)."""
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    leading, hidden, width = REAL_SHAPES[shape_name]
    x = torch.randn((rows, *leading, width), generator=gen, device=CUDA).to(BF16)[..., :hidden]
    z = torch.randn((rows, *leading, hidden), generator=gen, device=CUDA).to(BF16)
    w = 0.3 * torch.randn(hidden, generator=gen, device=CUDA)
    return x, (1.0 + w if kind == "gated" else w).to(BF16), z


def _call(kind: str, name: str, x, w, z):
    fn = TABLES[kind][name].fn
    return fn(x, w, EPS, z) if kind == "gated" else fn(x, w, EPS)


def _reference(kind: str, x, w, z):
    if kind == "gated":
        return gated_rms_norm_reference(x.double(), w.double(), EPS, z.double())
    return rms_norm_reference(x.double(), w.double(), EPS)


def _cases():
    for shape_name in REAL_SHAPES:
        kind = "gated" if shape_name == "gdn_gated" else "zero_centred"
        for rows in ROWS:
            yield pytest.param(kind, shape_name, rows, id=f"{shape_name}-rows{rows}")


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("kind", sorted(TABLES))
def test_triton_norm_property_on_gpu_small_dims(kind, dtype):
    check_norm_path(kind, TABLES[kind]["triton"].fn, dtype, NORM_PATHS["triton"][dtype], device=CUDA)


@pytest.mark.parametrize(("kind", "shape_name", "rows"), list(_cases()))
def test_triton_norm_equals_float64_reference_at_real_shapes(kind, shape_name, rows):
    assert TABLES[kind]["triton"].supports(rows, BF16, CUDA), TABLES[kind]["triton"].unavailable_reason(CUDA, BF16)
    x, w, z = _real_inputs(kind, shape_name, rows, seed=rows)
    out = _call(kind, "triton", x, w, z)
    assert out.dtype == BF16 and out.shape == x.shape
    err = assert_close(out, _reference(kind, x, w, z), NORM_PATHS["triton"][BF16], f"{shape_name} rows={rows}")
    REPORT["errors"][f"{shape_name}/rows{rows}"] = err


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_triton_norm_is_one_kernel_launch(kind):
    """The reason for the path: eager decode pays per launch, so a call must be exactly one kernel."""
    from torch.profiler import ProfilerActivity, profile

    x, w, z = _real_inputs(kind, "residual" if kind == "zero_centred" else "gdn_gated", 1, seed=0)
    _call(kind, "triton", x, w, z)  # compile outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _call(kind, "triton", x, w, z)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1, f"{kind}: {len(kernels)} kernels in one call (none: the profiler saw no CUDA activity): {kernels}"


@pytest.mark.parametrize(("kind", "shape_name", "rows"), [("zero_centred", "residual", 1), ("gated", "gdn_gated", 1),
                                                          ("zero_centred", "residual", 4096)])
def test_record_eager_time_per_call(kind, shape_name, rows):
    """Not a gate (timings on a shared machine): the eager per-call time of each path, for the report."""
    x, w, z = _real_inputs(kind, shape_name, rows, seed=1)
    for name in ("fused", "triton"):
        us = eager_wall_us(lambda name=name: _call(kind, name, x, w, z), calls=500, warmup=20)
        REPORT["us_per_call"][f"{shape_name}/rows{rows}/{name}"] = round(us, 2)
        print(f"{shape_name} rows={rows} {name}: {us:.1f} us per eager call")


def teardown_module(module):
    write_gpu_report("norm_gpu.json", REPORT)
