"""The MoE properties on a CUDA GPU, at small dims and at the real model's per-rank dimensions.

Real per-rank dims (TP=4): hidden 2048, 256 experts, top-8, expert intermediate 512/4 = 128, shared 128.
Run with `--hypothesis-profile=gpu`. With GPU_REPORT_DIR set, writes the measured errors and path timings
to $GPU_REPORT_DIR/moe_gpu.json.
"""
from __future__ import annotations

import statistics

import pytest
import torch
from hypothesis import strategies as st

from model.moe import EXPERT_PATHS, ROUTERS, MoEConfig, moe_block
from model.moe.experts import experts_reference
from model.tp import moe_block_tp
from model import tolerances
from tests.numerics.compare import assert_close, poisoned_like
from tests.numerics.moe_cases import (
    ROUTING_PATTERNS, MoECase, block_reference, check_expert_path, expert_path_error, make_hidden, make_moe_weights,
    make_routing, moe_cases,
)
from tests.numerics.gpu_timing import eager_wall_us, write_gpu_report
from tests.numerics.test_moe_router import (
    LOGIT_KINDS, RouterCase, check_router, make_logits, router_logit_cases, run_router_property,
)

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
REAL = dict(experts=256, top_k=8, hidden=2048, intermediate=128, shared_intermediate=128)
REPORT: dict = {"errors": {}, "timings_ms": {}}


def real_cases(tokens):
    return moe_cases(
        tokens=tokens,
        experts=st.just(REAL["experts"]),
        top_k=st.just(REAL["top_k"]),
        hidden=st.just(REAL["hidden"]),
        intermediate=st.just(REAL["intermediate"]),
        shared_intermediate=st.just(REAL["shared_intermediate"]),
    )


def _paths_for(dtype):
    return [n for n, p in sorted(EXPERT_PATHS.items()) if not p.is_reference and p.supports(p.min_tokens, dtype, DEVICE)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
def test_expert_paths_equal_reference_on_gpu_small_dims(dtype):
    for name in _paths_for(dtype):
        check_expert_path(EXPERT_PATHS[name], dtype, tolerances.expert_path_tolerance(name, dtype), device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
def test_expert_paths_equal_reference_at_real_per_rank_dims(dtype):
    for name in _paths_for(dtype):
        path = EXPERT_PATHS[name]
        tokens = st.integers(path.min_tokens, min(path.max_tokens or 512, 512))
        check_expert_path(path, dtype, tolerances.expert_path_tolerance(name, dtype), device=DEVICE, cases=real_cases(tokens))
        # Record the error per routing pattern at a few token counts for the report.
        for pattern in ROUTING_PATTERNS:
            for t in (1, 2, 4, 8, 64, 512):
                if path.supports(t, dtype, DEVICE):
                    case = MoECase(tokens=t, pattern=pattern, seed=t, **REAL)
                    err = expert_path_error(path, case, dtype, DEVICE)
                    key = f"{name}/{str(dtype).removeprefix('torch.')}/{pattern}"
                    REPORT["errors"][key] = max(err, REPORT["errors"].get(key, 0.0))


@pytest.mark.parametrize("tp", [1, 4])
def test_moe_block_at_real_dims_equals_float64_block(tp):
    """The whole block (router + dispatched experts + shared expert), unsharded and TP=4 summed, bf16."""
    full = dict(REAL, intermediate=512, shared_intermediate=512)  # the unsharded checkpoint
    for tokens in (1, 3, 8, 200):
        case = MoECase(tokens=tokens, pattern="random", seed=tokens, **full)
        w = make_moe_weights(case, torch.bfloat16, DEVICE)
        x = make_hidden(case, torch.bfloat16, DEVICE)
        out = moe_block(x, w, MoEConfig()) if tp == 1 else moe_block_tp(x, w, tp, MoEConfig())
        ref, scale = block_reference(x, w)
        err = assert_close(out, ref, tolerances.MOE_BLOCK[torch.bfloat16], f"block TP={tp} T={tokens}", scale=scale)
        REPORT["errors"][f"block_tp{tp}/bfloat16/T{tokens}"] = err


def _time_ms(fn, reps=50) -> float:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def test_expert_path_timings_at_real_per_rank_dims_are_recorded():
    """Not a gate: median time per path and token count (bf16), for the issue note and later baselines."""
    dtype = torch.bfloat16
    for tokens in (1, 2, 4, 8, 16, 64, 512, 2048):
        case = MoECase(tokens=tokens, pattern="random", seed=0, **REAL)
        w = make_moe_weights(case, dtype, DEVICE)
        x = make_hidden(case, dtype, DEVICE)
        weights, ids = make_routing(case, DEVICE)
        out = poisoned_like(x.shape, dtype, DEVICE)
        for name in _paths_for(dtype):
            path = EXPERT_PATHS[name]
            if not path.supports(tokens, dtype, DEVICE) or (name.startswith("tiny") and tokens > 64):
                continue
            ms = _time_ms(lambda: path.fn(x, w.w13, w.w2, weights, ids, out))
            REPORT["timings_ms"][f"{name}/T{tokens}"] = round(ms, 4)
    assert REPORT["timings_ms"], "no path was timed"


def teardown_module(module):
    write_gpu_report("moe_gpu.json", REPORT)


# --- the Triton paths: available here, and capturable in a CUDA graph ------------------------------------

TRITON_PATHS = ("triton_decode", "triton_grouped")


@pytest.mark.parametrize("name", TRITON_PATHS)
def test_triton_path_is_available_on_the_gpu(name):
    """Otherwise every test above would leave it out without a word."""
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert EXPERT_PATHS[name].supports(1, dtype, DEVICE), f"{name} is not available for {dtype} on {DEVICE}"


def _real_inputs(tokens: int, pattern: str, seed: int, dtype=torch.bfloat16):
    case = MoECase(tokens=tokens, pattern=pattern, seed=seed, **REAL)
    weights, ids = make_routing(case, DEVICE)
    return make_hidden(case, dtype, DEVICE), weights, ids


@pytest.mark.parametrize(
    ("name", "tokens"),
    [("triton_decode", t) for t in (1, 8, 64)] + [("triton_grouped", t) for t in (8, 512, 4096)],
)
def test_triton_path_replays_in_a_cuda_graph_on_new_routing(name, tokens):
    """Captured once, then replayed on other inputs copied into the captured buffers (including a skewed
    routing whose per-expert counts differ from the captured one): each replay writes every element of the
    NaN-poisoned out, equals the eager call bit for bit, and is within the bound of the float64 reference.
    A path that read the counts on the host or kept them in the graph would fail the skewed replay."""
    dtype = torch.bfloat16
    path = EXPERT_PATHS[name]
    w = make_moe_weights(MoECase(tokens=tokens, pattern="random", seed=0, **REAL), dtype, DEVICE)
    x, weights, ids = _real_inputs(tokens, "random", seed=1)
    out = poisoned_like(x.shape, dtype, DEVICE)

    side = torch.cuda.Stream()  # warm-up (compiles the kernels) off the capture stream, as torch requires
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        path.fn(x, w.w13, w.w2, weights, ids, out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        path.fn(x, w.w13, w.w2, weights, ids, out)

    bound = tolerances.expert_path_tolerance(name, dtype)
    for pattern, seed in (("random", 2), ("skewed", 3), ("random", 1)):
        new_x, new_weights, new_ids = _real_inputs(tokens, pattern, seed)
        x.copy_(new_x)
        weights.copy_(new_weights)
        ids.copy_(new_ids)
        out.fill_(float("nan"))
        graph.replay()
        eager = path.fn(new_x, w.w13, w.w2, new_weights, new_ids, poisoned_like(x.shape, dtype, DEVICE))
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), f"{name} T={tokens} {pattern}: the replay left elements unwritten"
        assert torch.equal(out, eager), f"{name} T={tokens} {pattern}: replay differs from the eager call"
        ref = experts_reference(new_x, w.w13, w.w2, new_weights, new_ids, poisoned_like(x.shape, torch.float64, DEVICE))
        err = assert_close(out, ref, bound, f"{name} T={tokens} {pattern} graph replay")
        REPORT["errors"][f"{name}/graph/bfloat16/T{tokens}/{pattern}"] = err


@pytest.mark.parametrize("tokens", [4096, 8192])
def test_triton_grouped_at_prefill_sizes_equals_reference(tokens):
    """Past the 512 tokens the hypothesis test draws: every routing pattern, bf16, poisoned out."""
    path = EXPERT_PATHS["triton_grouped"]
    w = make_moe_weights(MoECase(tokens=tokens, pattern="random", seed=0, **REAL), torch.bfloat16, DEVICE)
    for pattern in ROUTING_PATTERNS:
        x, weights, ids = _real_inputs(tokens, pattern, seed=tokens)
        out = path.fn(x, w.w13, w.w2, weights, ids, poisoned_like(x.shape, torch.bfloat16, DEVICE))
        ref = experts_reference(x, w.w13, w.w2, weights, ids, poisoned_like(x.shape, torch.float64, DEVICE))
        err = assert_close(out, ref, tolerances.expert_path_tolerance(path.name, torch.bfloat16), f"T={tokens} {pattern}")
        REPORT["errors"][f"triton_grouped/bfloat16/T{tokens}/{pattern}"] = err


# --- the fused Triton router (model.moe.triton_router) at the real dims: E = 256, top-8 ------------------


def test_triton_fused_router_is_available_on_the_gpu():
    """Otherwise a router sweep would leave it out without a word."""
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert ROUTERS["triton_fused"].supports(1, dtype, DEVICE), ROUTERS["triton_fused"].unavailable_reason(DEVICE, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("tokens", [1, 8, 64, 4096])
def test_triton_fused_router_at_real_dims_equals_reference(tokens, dtype):
    """Ids exactly the reference's, weights within float32's bound of the reference and the float64
    specification, for every logit kind (ties, signed zeros, coarse, random)."""
    for kind in LOGIT_KINDS:
        case = RouterCase(tokens=tokens, experts=REAL["experts"], top_k=REAL["top_k"], dtype=dtype, kind=kind, seed=tokens)
        check_router(ROUTERS["triton_fused"], case, DEVICE)


def test_triton_fused_router_property_at_real_expert_count():
    run_router_property(
        ROUTERS["triton_fused"],
        router_logit_cases(tokens=st.integers(1, 512), experts=st.just(REAL["experts"]),
                           top_k=st.sampled_from([1, 2, REAL["top_k"], REAL["experts"]])),
        device=DEVICE,
    )


def test_triton_fused_router_ranks_non_finite_logits_as_topk_softmax_does_on_the_gpu():
    """NaN of either sign, +-inf: the same ids as route_topk_softmax on this device (CUDA's `+ 0.0` makes every
    NaN the canonical positive one, ranked above +inf), and each such token's weights poisoned alike."""
    logits = torch.randn(6, REAL["experts"], device=DEVICE).to(torch.bfloat16)
    logits[0, 7] = float("nan")
    logits[1, 9] = -torch.tensor(float("nan"))
    logits[2, 11] = float("inf")
    logits[3, 13] = float("-inf")
    want_w, want_ids = ROUTERS["topk_softmax"](logits, REAL["top_k"])
    got_w, got_ids = ROUTERS["triton_fused"](logits, REAL["top_k"])
    assert torch.equal(got_ids, want_ids)
    assert torch.equal(got_w.isnan(), want_w.isnan())
    assert torch.isfinite(got_w[[3, 4, 5]]).all()


def test_triton_fused_router_replays_in_a_cuda_graph_on_new_logits():
    """Captured once, replayed on other logits copied into the captured buffer: equal to the eager call."""
    route = ROUTERS["triton_fused"]
    case = RouterCase(tokens=64, experts=REAL["experts"], top_k=REAL["top_k"], dtype="bfloat16", kind="random", seed=0)
    logits = make_logits(case, DEVICE)
    side = torch.cuda.Stream()  # warm-up (compiles the kernel) off the capture stream, as torch requires
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        route(logits, REAL["top_k"])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids = route(logits, REAL["top_k"])
    for kind in LOGIT_KINDS:
        new_logits = make_logits(RouterCase(**{**case.__dict__, "kind": kind, "seed": 1}), DEVICE)
        logits.copy_(new_logits)
        graph.replay()
        want_w, want_ids = route(new_logits, REAL["top_k"])
        torch.cuda.synchronize()
        assert torch.equal(ids, want_ids) and torch.equal(weights, want_w), f"replay differs on {kind} logits"


def test_router_timings_at_real_dims_are_recorded():
    """Not a gate: each router's time per call on the GPU (bf16 logits), eager wall time (launch-bound at
    decode sizes) and the CUDA-event median, for the lead's choice."""
    for tokens in (1, 8, 64, 4096):
        logits = make_logits(
            RouterCase(tokens=tokens, experts=REAL["experts"], top_k=REAL["top_k"], dtype="bfloat16", kind="random",
                       seed=0), DEVICE)
        for name in ("topk_softmax", "triton_fused"):
            def call(route=ROUTERS[name]):
                return route(logits, REAL["top_k"])
            REPORT["timings_ms"][f"router/{name}/T{tokens}/eager_wall"] = round(eager_wall_us(call) / 1e3, 5)
            REPORT["timings_ms"][f"router/{name}/T{tokens}/events"] = round(_time_ms(call), 5)
    print({k: v for k, v in REPORT["timings_ms"].items() if k.startswith("router/")})
