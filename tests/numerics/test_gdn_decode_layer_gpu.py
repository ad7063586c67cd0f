"""The `triton` GDN decode layer path on a CUDA GPU, compiled (not interpreted): the decode layer property at
small dims, and the path at the real per-rank dims of Qwen3.6 under TP=4 against the float64 reference.

Real dims: hidden 2048, 4 key heads, 8 value heads, head dims 128, conv kernel 4 (conv_dim 2048, value_dim
1024), batch 1, 8 and 256, bf16 and float32, the state updated in place and into a separate state (every
case checks both and that they are the same bits). Run with `--hypothesis-profile=gpu -s`; with GPU_REPORT_DIR
set, writes the errors and the eager per-call times of `triton` and `staged` to $GPU_REPORT_DIR/gdn_decode_gpu.json.
"""
from __future__ import annotations

import pytest
import torch

from model.gdn import GDN_DECODE_LAYER_PATHS, GDNDims
from model.tolerances import GDN_DECODE_LAYER, GDN_DECODE_LAYER_STATE
from tests.numerics.test_gdn_decode_layer import (
    DecodeCase, check_decode_layer_path, check_indexed_rows_equal_a_batch, decode_inputs, decode_layer_errors,
)
from tests.numerics.gpu_timing import eager_wall_us, write_gpu_report

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
F32, BF16 = torch.float32, torch.bfloat16
DTYPES = (F32, BF16)
REAL = GDNDims(hidden_size=2048, num_k_heads=4, num_v_heads=8, head_k_dim=128, head_v_dim=128, conv_kernel=4)
BATCHES = (1, 8, 256)
PATH = GDN_DECODE_LAYER_PATHS["triton"]
REPORT: dict = {"errors": {}, "us_per_call": {}}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_triton_decode_layer_property_on_gpu_small_dims(dtype):
    check_decode_layer_path(PATH.fn, dtype, GDN_DECODE_LAYER["triton"][dtype], GDN_DECODE_LAYER_STATE["triton"][dtype],
                            device=CUDA)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_triton_decode_layer_equals_float64_reference_at_real_dims(dtype, batch):
    assert PATH.supports(1, dtype, CUDA), PATH.unavailable_reason(CUDA, dtype)
    case = DecodeCase("real", batch, _name(dtype), seed=batch)
    out_err, conv_err, rec_err = decode_layer_errors(PATH.fn, case, dtype, (dtype, F32), CUDA, dims=REAL)
    REPORT["errors"][f"{_name(dtype)}/B{batch}"] = {"output": out_err, "conv": conv_err, "recurrent": rec_err}
    print(f"{_name(dtype)} B={batch}: output {out_err:.2e}, conv state {conv_err:.2e}, recurrent {rec_err:.2e}")
    out_bound, state_bound = GDN_DECODE_LAYER["triton"][dtype], GDN_DECODE_LAYER_STATE["triton"][dtype]
    assert out_err <= out_bound, f"output: {out_err:.3e} > {out_bound:.1e}"
    assert conv_err <= state_bound and rec_err <= state_bound, f"state: {conv_err:.3e}, {rec_err:.3e} > {state_bound:.1e}"


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_indexed_state_rows_equal_a_batch_at_real_dims(dtype, batch):
    """The served GDN layer's mode: a server's state slots advanced in place, bit for bit the batch mode."""
    check_indexed_rows_equal_a_batch(DecodeCase("real", batch, _name(dtype), seed=batch), CUDA, dims=REAL)


def test_triton_decode_layer_is_one_triton_kernel_between_two_gemms():
    """The reason for the path: eager decode pays per launch. The GEMMs are cuBLAS's (one kernel each, or a
    split-K pair); the rest is one Triton kernel."""
    from torch.profiler import ProfilerActivity, profile

    x, w, state = decode_inputs(DecodeCase("real", 1, "bfloat16", 0), CUDA, dims=REAL)
    out_state = state.empty_like()
    PATH.fn(x, w, state, out_state)  # compile outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        PATH.fn(x, w, state, out_state)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print("kernels:", kernels)
    assert sum("_gdn_decode_kernel" in k for k in kernels) == 1, kernels
    assert len(kernels) <= 5, f"{len(kernels)} kernels in one decode layer: {kernels}"


@pytest.mark.parametrize("batch", [1, 256])
def test_record_eager_time_per_call(batch):
    """Not a gate (timings on a shared machine): the eager per-call time of `staged` and `triton`, in place
    (the target: triton <= 150 us at B = 1 on the H200, from ~645 us staged)."""
    x, w, state = decode_inputs(DecodeCase("real", batch, "bfloat16", 1), CUDA, dims=REAL)
    for name in ("staged", "triton"):
        fn = GDN_DECODE_LAYER_PATHS[name].fn
        us = eager_wall_us(lambda fn=fn: fn(x, w, state, state), calls=200, warmup=20)
        REPORT["us_per_call"][f"B{batch}/{name}"] = round(us, 2)
        print(f"GDN decode layer B={batch} {name}: {us:.1f} us per eager call")


def teardown_module(module):
    write_gpu_report("gdn_decode_gpu.json", REPORT)
