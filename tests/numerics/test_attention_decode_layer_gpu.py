"""The `triton` attention decode layer path on a CUDA GPU, compiled (not interpreted): the decode property at small
dims and at the real per-rank dims of Qwen3.6 under TP=4, determinism, and a CUDA-graph capture that replays to
the eager bits at every length.

Real dims: hidden 2048, 4 query heads, 1 kv head (16 and 2 over 4 ranks; vLLM replicates the kv heads), head_dim
256, rotary_dim 64, theta 1e7, eps 1e-6; a StaticKVCache of 320 positions, lengths up to 300; batch 1, 8 and 64;
bf16 and float32. Every property case also checks that the path writes the new key and value at position
cache.length only and repeats its bits. Run with `--hypothesis-profile=gpu -s`; with GPU_REPORT_DIR set, writes the
errors and the eager per-call times of `triton` and `staged` to $GPU_REPORT_DIR/attention_decode_gpu.json.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st

from model.attention.decode_layer import ATTENTION_DECODE_LAYER_PATHS
from model.attention.layer import AttentionDims
from model.tolerances import ATTENTION_DECODE_LAYER, ATTENTION_DECODE_LAYER_CACHE
from tests.numerics.gpu_timing import eager_wall_us, write_gpu_report
from tests.numerics.test_attention_decode_layer import (
    AttentionDecodeCase,
    attention_decode_errors,
    check_attention_decode_path,
    copy_cache,
    decode_cases,
    decode_inputs,
    edge_cases,
    same_bits,
)

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
F32, BF16 = torch.float32, torch.bfloat16
DTYPES = (F32, BF16)
REAL = AttentionDims(hidden_size=2048, num_heads=4, num_kv_heads=1, head_dim=256, rotary_dim=64, rope_theta=1e7,
                     eps=1e-6)
REAL_MAX_LEN = 320
LONGEST = 300
BATCHES = (1, 8, 64)
PATH = ATTENTION_DECODE_LAYER_PATHS["triton"]
REPORT: dict = {"errors": {}, "us_per_call": {}}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _bounds(dtype: torch.dtype) -> tuple[float, float]:
    return ATTENTION_DECODE_LAYER["triton"][dtype], ATTENTION_DECODE_LAYER_CACHE["triton"][dtype]


def real_case(batch: int, length: int, dtype: torch.dtype, seed: int) -> AttentionDecodeCase:
    """A case at the real dims (its group / head_dim / rotary fields name them; the dims are passed as REAL)."""
    return AttentionDecodeCase(4, 256, "quarter", batch, length, _name(dtype), seed)


def real_inputs(case: AttentionDecodeCase):
    return decode_inputs(case, CUDA, REAL, REAL_MAX_LEN)


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_triton_attention_decode_property_on_gpu_small_dims(dtype):
    check_attention_decode_path(PATH.fn, dtype, *_bounds(dtype), device=CUDA, examples=edge_cases(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_triton_attention_decode_property_at_real_dims(dtype):
    cases = decode_cases(dtype, group=st.just(4), head_dim=st.just(256), rotary=st.just("quarter"),
                         batch=st.sampled_from(BATCHES), length=st.integers(0, LONGEST))
    check_attention_decode_path(PATH.fn, dtype, *_bounds(dtype), device=CUDA, cases=cases, dims=REAL,
                                max_len=REAL_MAX_LEN,
                                examples=(real_case(1, 0, dtype, 0), real_case(64, LONGEST, dtype, 1)))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_triton_attention_decode_equals_float64_reference_at_real_dims(dtype, batch):
    assert PATH.supports(1, dtype, CUDA), PATH.unavailable_reason(CUDA, dtype)
    out_err, k_err, v_err = attention_decode_errors(PATH.fn, real_case(batch, LONGEST, dtype, batch), dtype, CUDA,
                                                    REAL, REAL_MAX_LEN)
    REPORT["errors"][f"{_name(dtype)}/B{batch}/L{LONGEST}"] = {"output": out_err, "key": k_err, "value": v_err}
    print(f"{_name(dtype)} B={batch} L={LONGEST}: output {out_err:.2e}, new key {k_err:.2e}, new value {v_err:.2e}")
    out_bound, cache_bound = _bounds(dtype)
    assert out_err <= out_bound, f"output: {out_err:.3e} > {out_bound:.1e}"
    assert k_err <= cache_bound and v_err <= cache_bound, f"cache: {k_err:.3e}, {v_err:.3e} > {cache_bound:.1e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_runs_give_the_same_bits_at_batch_64(dtype):
    """Deterministic: the key blocks are summed in a fixed order, each (sequence, head) by one program."""
    x, w, cache = real_inputs(real_case(64, LONGEST, dtype, 5))
    first = copy_cache(cache)
    y = PATH.fn(x, w, first)
    for _ in range(4):
        again = copy_cache(cache)
        assert same_bits(PATH.fn(x, w, again), y)
        assert same_bits(again.k, first.k) and same_bits(again.v, first.v)


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_a_captured_graph_replays_to_the_eager_bits_at_every_length(dtype):
    """The length is read on the device: one capture serves every length. Warm-up (compile, rope table, cuBLAS
    workspace) on a side stream, as torch's CUDA-graph notes ask; the capture itself runs nothing."""
    x, w, cache = real_inputs(real_case(8, 40, dtype, 9))
    original = copy_cache(cache)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            PATH.fn(x, w, copy_cache(original))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = PATH.fn(x, w, cache)
    torch.cuda.synchronize()
    assert same_bits(cache.k, original.k) and same_bits(cache.v, original.v), "the capture wrote the cache"
    for length in (40, 41, LONGEST, 0, 64):
        cache.k.copy_(original.k)
        cache.v.copy_(original.v)
        cache.length.fill_(length)
        eager = copy_cache(cache)
        graph.replay()
        y_eager = PATH.fn(x, w, eager)
        torch.cuda.synchronize()
        assert same_bits(y_graph, y_eager), f"length {length}: the replay's output differs from the eager call's"
        assert same_bits(cache.k, eager.k) and same_bits(cache.v, eager.v), f"length {length}: the cache differs"
        assert int(cache.length) == length, "the path moved the length"


def test_triton_attention_decode_is_one_triton_kernel_between_two_gemms():
    """The reason for the path: eager decode pays per launch. The GEMMs are cuBLAS's (one kernel each, or a split-K
    pair); the rest is one Triton kernel."""
    from torch.profiler import ProfilerActivity, profile

    x, w, cache = real_inputs(real_case(1, LONGEST, BF16, 0))
    PATH.fn(x, w, copy_cache(cache))  # compile and build the rope table outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        PATH.fn(x, w, cache)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print("kernels:", kernels)
    assert sum("_attention_decode_kernel" in k for k in kernels) == 1, kernels
    assert len(kernels) <= 5, f"{len(kernels)} kernels in one attention decode layer: {kernels}"


@pytest.mark.parametrize("batch", [1, 64])
def test_record_eager_time_per_call(batch):
    """Not a gate (timings on a shared machine): the eager per-call time of `staged` and `triton` at L = 300."""
    x, w, cache = real_inputs(real_case(batch, LONGEST, BF16, 1))
    for name in ("staged", "triton"):
        fn = ATTENTION_DECODE_LAYER_PATHS[name].fn
        us = eager_wall_us(lambda fn=fn: fn(x, w, cache), calls=200, warmup=20)
        REPORT["us_per_call"][f"B{batch}/{name}"] = round(us, 2)
        print(f"attention decode layer B={batch} {name}: {us:.1f} us per eager call")


def teardown_module(module):
    write_gpu_report("attention_decode_gpu.json", REPORT)
