"""The `triton` conv path on a CUDA GPU, compiled (not interpreted): the conv property at small dims, and the path
at the real per-rank dims of Qwen3.6 under TP=4 against the float64 reference and against `prefill`.

Real dims: conv channels 2048 (q 512 | k 512 | v 1024), kernel 4; x a column slice of the stacked projection
output [q | k | v | z | b | a] (token stride 3088, as `gdn_layer`'s inputs can be), B = 1, T = 1, 7, 64, 4096,
16384, bf16 and float32. Run with `--hypothesis-profile=gpu -s`; with GPU_REPORT_DIR set, writes the errors and
the eager per-call times of `triton` and `prefill` to $GPU_REPORT_DIR/gdn_conv_gpu.json.
"""
from __future__ import annotations

import pytest
import torch

from model.gdn import CONV_PATHS, run_conv_path
from model.tolerances import GDN_CONV_PATHS
from tests.numerics.compare import relative_error
from tests.numerics.gpu_timing import eager_wall_us, write_gpu_report
from tests.numerics.test_gdn_conv import check_conv_path, edge_cases

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
F32, BF16 = torch.float32, torch.bfloat16
DTYPES = (F32, BF16)
CHANNELS, KERNEL, PROJECTION = 2048, 4, 2048 + 1024 + 8 + 8  # conv channels, taps, the stacked projection's width
TOKENS = (1, 7, 64, 4096, 16384)
PATH = CONV_PATHS["triton"]
REPORT: dict = {"errors": {}, "us_per_call": {}}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def real_inputs(tokens: int, dtype: torch.dtype, seed: int = 0):
    """(x [1, T, 2048] sliced from the stacked projection, weight [2048, 4], state [1, 2048, 3]) on the GPU."""
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    projection = torch.randn(1, tokens, PROJECTION, generator=gen, device=CUDA).to(dtype)
    weight = (0.5 * torch.randn(CHANNELS, KERNEL, generator=gen, device=CUDA)).to(dtype)
    state = torch.randn(1, CHANNELS, KERNEL - 1, generator=gen, device=CUDA).to(dtype)
    return projection[:, :, :CHANNELS], weight, state


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_triton_conv_property_on_gpu_small_dims(dtype):
    check_conv_path(PATH.fn, dtype, GDN_CONV_PATHS["triton"][dtype], device=CUDA, examples=edge_cases(dtype))


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_triton_conv_equals_float64_reference_and_prefill_at_real_dims(dtype, tokens):
    assert PATH.supports(tokens, dtype, CUDA), PATH.unavailable_reason(CUDA, dtype)
    x, weight, state = real_inputs(tokens, dtype, seed=tokens)
    before = state.clone()
    ref_y, ref_state = run_conv_path("reference", x.double(), weight.double(), state.double())
    y, new_state = run_conv_path("triton", x, weight, state)
    prefill_y, prefill_state = run_conv_path("prefill", x, weight, state)
    err, prefill_err = relative_error(y, ref_y), relative_error(prefill_y, ref_y)
    differ = (y != prefill_y).float().mean().item()
    REPORT["errors"][f"{_name(dtype)}/T{tokens}"] = {"triton": err, "prefill": prefill_err, "elements_differ": differ}
    print(f"{_name(dtype)} T={tokens}: triton {err:.2e}, prefill {prefill_err:.2e}, {differ:.2%} of elements differ")
    bound = GDN_CONV_PATHS["triton"][dtype]
    assert err <= bound, f"triton: relative error {err:.3e} > {bound:.1e}"
    # Both compute float32 taps and round once: compiled, they agree but for the summation order's last bit.
    assert relative_error(y, prefill_y) <= bound, "triton and prefill disagree beyond the bound"
    assert torch.equal(state, before), "the incoming state was modified"
    assert torch.equal(new_state, ref_state.to(new_state.dtype)) and torch.equal(new_state, prefill_state)


def test_triton_conv_is_one_kernel_and_replays_from_a_cuda_graph():
    """The reason for the path: one launch for y and the new state, capturable."""
    from torch.profiler import ProfilerActivity, profile

    x, weight, state = real_inputs(4096, BF16, seed=1)
    y, new_state = PATH.fn(x, weight, state)  # compile outside the profile and the capture
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        PATH.fn(x, weight, state)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print("kernels:", kernels)
    assert len(kernels) == 1 and "_causal_conv1d_kernel" in kernels[0], kernels
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        PATH.fn(x, weight, state)  # warm-up on the capture stream
        with torch.cuda.graph(graph, stream=stream):
            replayed_y, replayed_state = PATH.fn(x, weight, state)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed_y, y) and torch.equal(replayed_state, new_state)


@pytest.mark.parametrize("tokens", TOKENS)
def test_record_eager_time_per_call(tokens):
    """Not a gate (timings on a shared machine): the eager per-call time of `prefill` and `triton` in bf16 (the
    layer's conv stage took 908 us at T = 16384 by graph replay with `prefill`; its HBM floor is ~30 us)."""
    x, weight, state = real_inputs(tokens, BF16, seed=2)
    for name in ("prefill", "triton"):
        fn = CONV_PATHS[name].fn
        us = eager_wall_us(lambda fn=fn: fn(x, weight, state), calls=100, warmup=10)
        REPORT["us_per_call"][f"T{tokens}/{name}"] = round(us, 2)
        print(f"conv T={tokens} {name}: {us:.1f} us per eager call")


def teardown_module(module):
    write_gpu_report("gdn_conv_gpu.json", REPORT)
