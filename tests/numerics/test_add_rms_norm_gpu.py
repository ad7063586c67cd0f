"""The Triton residual add + RMSNorm (model.norm.rms_norm.ADD_RMS_NORM_PATHS["triton"]) on a CUDA GPU, compiled (not
interpreted): both outputs bit for bit torch's `h + y` and model.norm.triton_rms_norm's one-launch RMSNorm of that sum,
and within the norm tolerances of the float64 reference, at small dims and at the residual stream's real shape
([rows, 2048], rows = tokens in 1, 8, 64, 256; bf16 and float32); one kernel launch per call; the prepared launch
(model.dispatch.triton_launch) computing the JIT's bits whatever the inputs' alignment and layout; a CUDA graph
replaying the eager bits. Prints the eager per-call time of the unfused step's kernels against the one launch.

    python3 -m pytest -m gpu -s --hypothesis-profile=gpu tests/numerics/test_add_rms_norm_gpu.py

With GPU_REPORT_DIR set, writes the errors and times to $GPU_REPORT_DIR/add_rms_norm_gpu.json.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

from model.dispatch import triton_launch
from model.dispatch.paths import LOW_PRECISION
from model.norm import rms_norm as norm_paths
from model.norm.rms_norm import ADD_RMS_NORM_PATHS, rms_norm_reference
from model.tolerances import ADD_NORM_PATHS
from tests.numerics.compare import assert_close, relative_error
from tests.numerics.gpu_timing import eager_wall_us, through_the_jit, write_gpu_report
from tests.numerics.test_add_rms_norm import EPS, add_norm_cases, bit_differences, check_add_norm_path, same_bits

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
F32, BF16 = torch.float32, torch.bfloat16
PATH = ADD_RMS_NORM_PATHS["triton"]
HIDDEN = 2048  # the residual stream's width
ROWS = (1, 8, 64, 256)
DTYPE_IDS = {d: str(d).removeprefix("torch.") for d in LOW_PRECISION}
REPORT: dict = {"errors": {}, "us_per_call": {}}


def torch_then_rms_norm_triton(h, y, weight, eps):
    """What the `triton` path must equal bit for bit: torch's `h + y`, then the one-launch RMSNorm of that sum."""
    s = h + y
    return s, norm_paths.norm_triton.zero_centred_rms_norm(s, weight, eps)


def unfused_then_rms_norm_triton(h, y, weight, eps):
    """The step with the one-launch RMSNorm but the add apart: two launches."""
    return norm_paths.rms_norm_triton(h + y, weight, eps)


def _inputs(rows: int, dtype: torch.dtype, seed: int, offset: int = 0, width: int = HIDDEN):
    """(h, y, w) at the real shape: h [rows, 2048] starting `offset` elements into its buffer (1: not 16-byte
    aligned), the first 2048 columns of rows `width` wide; y about half h's size; w near 0."""
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    flat = torch.randn(rows * width + offset, generator=gen, device=CUDA).to(dtype)
    h = flat[offset:].view(rows, width)[:, :HIDDEN]
    y = (0.5 * torch.randn(rows, HIDDEN, generator=gen, device=CUDA)).to(dtype)
    w = (0.3 * torch.randn(HIDDEN, generator=gen, device=CUDA)).to(dtype)
    return h, y, w


def _assert_same_bits(got, want, what: str) -> None:
    for name, a, b in zip(("h_new", "normed"), got, want):
        assert same_bits(a, b), f"{what}: {name} differs: {bit_differences(a, b)}"


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=DTYPE_IDS.get)
def test_triton_add_norm_property_on_gpu_small_dims(dtype):
    check_add_norm_path(PATH.fn, dtype, ADD_NORM_PATHS["triton"][dtype], device=CUDA,
                        bits_against=torch_then_rms_norm_triton, contiguous=True)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [BF16, F32], ids=DTYPE_IDS.get)
def test_triton_add_norm_property_at_the_real_hidden_size(dtype, rows):
    cases = add_norm_cases(dtype, hidden=st.just(HIDDEN), leading=st.just((rows,)))
    check_add_norm_path(PATH.fn, dtype, ADD_NORM_PATHS["triton"][dtype], device=CUDA, cases=cases,
                        bits_against=torch_then_rms_norm_triton, contiguous=True)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", [BF16, F32], ids=DTYPE_IDS.get)
def test_triton_add_norm_at_the_real_shape(dtype, rows):
    """Bit for bit torch's sum and the RMSNorm kernel of it; the errors of it and of `fused`, for the report."""
    assert PATH.supports(rows, dtype, CUDA), PATH.unavailable_reason(CUDA, dtype)
    h, y, w = _inputs(rows, dtype, seed=rows)
    got = PATH.fn(h, y, w, EPS)
    _assert_same_bits(got, torch_then_rms_norm_triton(h, y, w, EPS), f"{dtype} rows={rows}")
    sum64 = h.double() + y.double()
    ref = rms_norm_reference(sum64, w.double(), EPS)
    bound = ADD_NORM_PATHS["triton"][dtype]
    fused = ADD_RMS_NORM_PATHS["fused"].fn(h, y, w, EPS)
    REPORT["errors"][f"{DTYPE_IDS[dtype]}/rows{rows}"] = {
        "h_new": assert_close(got[0], sum64, bound, f"h_new {dtype} rows={rows}"),
        "normed": assert_close(got[1], ref, bound, f"normed {dtype} rows={rows}"),
        "normed_fused": relative_error(fused[1], ref),
        "normed_vs_fused_elements_differing": int((got[1] != fused[1]).sum()),
    }


def test_triton_add_norm_is_one_kernel_launch():
    """The reason for the path: eager decode pays per launch, so a call must be exactly one kernel."""
    from torch.profiler import ProfilerActivity, profile

    h, y, w = _inputs(1, BF16, seed=0)
    for _ in range(2):  # compile, and prepare the launch, outside the profile
        PATH.fn(h, y, w, EPS)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        PATH.fn(h, y, w, EPS)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1, f"{len(kernels)} kernels in one call (none: the profiler saw no CUDA activity): {kernels}"


@pytest.mark.parametrize("rows", [1, 8, 256])
def test_prepared_launch_equals_the_jit(rows):
    """Whatever changes between calls (another h, a misaligned or strided h, another dtype), the prepared launch
    computes the JIT's bits, and it is the prepared route that ran. The aligned case runs first, so a plan that
    ignored alignment would be reused, wrongly, by the misaligned one."""
    cases = [
        ("aligned", _inputs(rows, BF16, seed=rows)),
        ("misaligned", _inputs(rows, BF16, seed=rows + 1, offset=1)),
        ("strided", _inputs(rows, BF16, seed=rows + 2, width=2 * HIDDEN)),
        ("float32", _inputs(rows, F32, seed=rows + 3)),
    ]
    for name, (h, y, w) in cases:
        expected = through_the_jit(lambda h=h, y=y, w=w: PATH.fn(h, y, w, EPS))
        _assert_same_bits(expected, torch_then_rms_norm_triton(h, y, w, EPS), f"{name} through the JIT")
        before = triton_launch.direct_launches()
        for _ in range(3):  # the first call of a new key may take the JIT; the later ones must not
            _assert_same_bits(PATH.fn(h, y, w, EPS), expected, f"{name}: prepared against JIT")
        assert triton_launch.direct_launches() - before >= 2, f"{name}: the prepared route did not run"


def test_a_cuda_graph_replays_the_eager_bits():
    """Captured once, replayed on new values in the captured inputs: the eager call's bits each time."""
    static_h, static_y, w = _inputs(8, BF16, seed=3)
    static_h = static_h.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and prepare outside the capture
        for _ in range(2):
            PATH.fn(static_h, static_y, w, EPS)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = PATH.fn(static_h, static_y, w, EPS)
    for seed in (4, 5):
        h, y, _ = _inputs(8, BF16, seed=seed)
        static_h.copy_(h)
        static_y.copy_(y)
        graph.replay()
        torch.cuda.synchronize()
        _assert_same_bits(captured, PATH.fn(h, y, w, EPS), f"replay with seed {seed}")


@pytest.mark.parametrize("rows", [1, 256])
def test_record_eager_time_per_call(rows):
    """Not a gate (timings on a shared machine): the eager per-call time of the unfused step (`fused`: the add,
    then casts, 1 + w, F.rms_norm and the cast back), of the add then the one-launch RMSNorm, and of `triton`."""
    h, y, w = _inputs(rows, BF16, seed=7)
    calls = {
        "fused": lambda: ADD_RMS_NORM_PATHS["fused"].fn(h, y, w, EPS),
        "add_then_rms_norm_triton": lambda: unfused_then_rms_norm_triton(h, y, w, EPS),
        "triton": lambda: PATH.fn(h, y, w, EPS),
    }
    for name, call in calls.items():
        us = eager_wall_us(call, calls=500, warmup=20)
        REPORT["us_per_call"][f"bf16/rows{rows}/{name}"] = round(us, 2)
        print(f"residual add + norm rows={rows} {name}: {us:.1f} us per eager call")


def teardown_module(module):
    write_gpu_report("add_rms_norm_gpu.json", REPORT)
