"""The expert-path and router properties for the Triton paths, on the CPU through Triton's interpreter.

Not collected by the suite itself (the file name does not start with `test_`): the interpreter must be
chosen before triton is imported, so test_moe_triton_interpreter.py runs this module in a subprocess with
TRITON_INTERPRET=1. Dims are small and examples few: the interpreter runs each Triton program as Python.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

from model.moe import EXPERT_PATHS, ROUTERS
from model.moe import triton_decode, triton_grouped, triton_router
from model import tolerances
from model.moe.experts import experts_reference
from tests.numerics.compare import assert_close, poisoned_like
from tests.numerics.moe_cases import MoECase, check_expert_path, make_hidden, make_moe_weights, make_routing, moe_cases
from tests.numerics.test_moe_expert_paths import (
    test_non_finite_token_propagates_to_its_row_only as non_finite_token_propagates_to_its_row_only,
)
from tests.numerics import test_moe_router as router_tests
from tests.numerics.test_moe_router import EDGE_ROUTER_CASES, TIE_CASES, RouterCase, router_logit_cases

TRITON_PATHS = ("triton_decode", "triton_grouped")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
EXAMPLES_PER_DTYPE = 5

SMALL_CASES = moe_cases(
    tokens=st.integers(1, 8),
    experts=st.integers(1, 16),
    max_top_k=4,
    hidden=st.integers(4, 48),
    intermediate=st.integers(1, 24),
)
# Always run: the smallest block; dims past every interpreter block size, so each loop takes several steps
# and each grid axis several programs; silent experts; one expert with several row blocks of the grouped path.
EDGE_CASES = (
    MoECase(tokens=1, experts=1, top_k=1, hidden=4, intermediate=1, shared_intermediate=1, pattern="random", seed=0),
    MoECase(tokens=8, experts=16, top_k=4, hidden=40, intermediate=20, shared_intermediate=20, pattern="ties", seed=1),
    MoECase(tokens=8, experts=16, top_k=4, hidden=48, intermediate=24, shared_intermediate=24, pattern="empty_experts", seed=2),
    MoECase(tokens=40, experts=4, top_k=1, hidden=24, intermediate=8, shared_intermediate=8, pattern="one_expert", seed=3),
)
# More pairs than one grouping program takes (1024), so the atomic ranks span programs.
MANY_PAIRS = MoECase(tokens=130, experts=8, top_k=8, hidden=8, intermediate=4, shared_intermediate=4, pattern="random", seed=4)


@pytest.mark.parametrize("name", TRITON_PATHS)
def test_path_runs_through_the_interpreter_on_cpu(name):
    assert triton_decode.INTERPRETED and triton_grouped.INTERPRETED, "TRITON_INTERPRET=1 was not in effect"
    assert all(EXPERT_PATHS[name].supports(1, dtype, "cpu") for dtype in DTYPES)
    assert not EXPERT_PATHS[name].supports(1, torch.float32, "cuda"), "interpreted kernels claim a GPU"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name", TRITON_PATHS)
def test_path_equals_float64_reference(name, dtype):
    path = EXPERT_PATHS[name]
    check_expert_path(
        path, dtype, tolerances.expert_path_tolerance(name, dtype), cases=SMALL_CASES,
        run_settings=settings(max_examples=EXAMPLES_PER_DTYPE), examples=EDGE_CASES,
    )


def test_triton_grouped_with_pairs_over_several_grouping_programs():
    path = EXPERT_PATHS["triton_grouped"]
    check_expert_path(
        path, torch.float32, tolerances.expert_path_tolerance(path.name, torch.float32),
        cases=st.just(MANY_PAIRS), run_settings=settings(max_examples=1),
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, on the inf inputs
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", TRITON_PATHS)
def test_non_finite_token_propagates_to_its_row_only(name, bad_value):
    non_finite_token_propagates_to_its_row_only(name, bad_value)


@pytest.mark.parametrize("name", TRITON_PATHS)
def test_strided_inputs_and_output_give_the_reference(name):
    """Row strides are the kernels' own; a last dim with a stride (weights stored transposed, a strided out)
    goes through the wrapper's copies. Every element of the strided `out` is still written."""
    case = MoECase(tokens=5, experts=6, top_k=3, hidden=24, intermediate=12, shared_intermediate=12, pattern="random", seed=5)
    w = make_moe_weights(case, torch.float32)
    x_wide = torch.cat([make_hidden(case, torch.float32), torch.full((5, 7), float("nan"))], dim=1)
    x = x_wide[:, : case.hidden]  # row stride 31: the NaN columns must never be read
    w13 = w.w13.transpose(1, 2).contiguous().transpose(1, 2)  # same values, last dim strided
    weights, ids = make_routing(case)
    ids = ids.t().contiguous().t()  # column-major ids
    out_wide = poisoned_like((5, 2 * case.hidden), torch.float32, "cpu")
    out = out_wide[:, ::2]
    EXPERT_PATHS[name].fn(x, w13, w.w2, weights, ids, out)
    ref = experts_reference(x, w.w13, w.w2, weights, ids, poisoned_like(x.shape, torch.float64, "cpu"))
    assert_close(out, ref, tolerances.expert_path_tolerance(name, torch.float32), f"{name}, strided tensors")
    assert out_wide[:, 1::2].isnan().all(), f"{name} wrote outside the strided out"


# --- the fused router (model.moe.triton_router): tests named `triton_fused` so `-k triton_fused` picks them ---

ROUTER_EXAMPLES_PER_DTYPE = 20
# Past one power of two (BLOCK_E 64, so padding lanes), up to E with k = E: the interpreter loops k times.
SMALL_ROUTER_CASES = dict(tokens=st.integers(1, 8), experts=st.integers(1, 40))


def test_triton_fused_router_runs_through_the_interpreter_on_cpu():
    path = ROUTERS["triton_fused"]
    assert triton_router.INTERPRETED, "TRITON_INTERPRET=1 was not in effect"
    assert all(path.supports(1, dtype, "cpu") for dtype in DTYPES + (torch.float64,))
    assert not path.supports(1, torch.float32, "cuda"), "an interpreted kernel claims a GPU"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_triton_fused_router_equals_the_reference(dtype):
    router_tests.run_router_property(
        ROUTERS["triton_fused"], router_logit_cases(dtypes=st.just(dtype), **SMALL_ROUTER_CASES),
        settings(max_examples=ROUTER_EXAMPLES_PER_DTYPE),
        examples=[c for c in EDGE_ROUTER_CASES if c.dtype == str(dtype).removeprefix("torch.")],
    )


@pytest.mark.parametrize(
    "case",
    [
        RouterCase(tokens=3, experts=512, top_k=8, dtype="bfloat16", kind="few_values", seed=6),  # E beyond the model's
        RouterCase(tokens=2, experts=300, top_k=1, dtype="float32", kind="coarse", seed=7),  # 212 padding lanes
        RouterCase(tokens=1, experts=64, top_k=64, dtype="float16", kind="signed_zeros", seed=8),
        RouterCase(tokens=2, experts=24, top_k=5, dtype="float64", kind="coarse", seed=9),
    ],
    ids=lambda c: f"E{c.experts}-k{c.top_k}-{c.dtype}",
)
def test_triton_fused_router_at_wider_expert_counts_and_float64_logits(case):
    router_tests.check_router(ROUTERS["triton_fused"], case)


@pytest.mark.parametrize(("logits", "top_k", "expected"), TIE_CASES)
def test_triton_fused_router_tie_rule(logits, top_k, expected):
    router_tests.test_router_tie_rule_selects_lower_expert_id("triton_fused", logits, top_k, expected)


def test_triton_fused_router_tied_experts_get_equal_weights():
    router_tests.test_router_tied_experts_get_equal_weights("triton_fused")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, on inf - inf
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_triton_fused_router_non_finite_logit_poisons_its_token_only(bad):
    router_tests.test_router_non_finite_logit_poisons_its_token_only("triton_fused", bad)


def test_triton_fused_router_ranks_nan_as_the_reference_does():
    """A NaN with the sign bit clear ranks above +inf, one with it set below -inf (on the CPU, where the
    reference's `+ 0.0` keeps a NaN's sign), as route_topk_softmax ranks them."""
    negative_nan = -torch.tensor(float("nan"))
    assert negative_nan.view(torch.int32).item() < 0, "this platform lost the NaN's sign bit"
    logits = torch.tensor([[1.0, float("nan"), 3.0, float("-inf")], [1.0, 0.0, 3.0, float("-inf")]])
    logits[1, 1] = negative_nan
    want = router_tests.route_topk_softmax(logits, 4)[1]
    assert ROUTERS["triton_fused"](logits, 4)[1].tolist() == want.tolist() == [[1, 2, 0, 3], [2, 0, 3, 1]]


def test_triton_fused_router_rejects_top_k_outside_the_expert_count():
    router_tests.test_router_rejects_top_k_outside_the_expert_count("triton_fused")


def test_triton_fused_router_float64_logits_are_ranked_as_float32():
    assert "triton_fused" in router_tests.CPU_ROUTERS
    router_tests.test_router_float64_logits_are_ranked_as_float32()


def test_triton_fused_router_takes_strided_logits_and_leading_dims():
    """Row and element strides are the kernel's own (no copy); [..., E] logits give [..., k] outputs."""
    wide = torch.randn(5, 2 * 24, generator=torch.Generator().manual_seed(0))
    logits = wide[:, ::2]  # row stride 48, element stride 2
    weights, ids = ROUTERS["triton_fused"](logits, 4)
    ref_w, ref_ids = router_tests.route_reference(logits, 4)
    assert torch.equal(ids, ref_ids)
    assert (weights - ref_w).abs().max().item() <= tolerances.ROUTER_WEIGHTS[torch.float32]
    batched_w, batched_ids = ROUTERS["triton_fused"](logits[:4].reshape(2, 2, 24), 4)
    assert batched_ids.shape == (2, 2, 4) and torch.equal(batched_ids.reshape(4, 4), ids[:4])
    assert torch.equal(batched_w.reshape(4, 4), weights[:4])


def test_triton_fused_router_takes_no_tokens_and_refuses_too_many_experts():
    weights, ids = ROUTERS["triton_fused"](torch.empty(0, 16), 2)
    assert weights.shape == ids.shape == (0, 2)
    too_many = triton_router.MAX_EXPERTS + 1
    with pytest.raises(ValueError, match=f"at most {triton_router.MAX_EXPERTS} experts, not {too_many}.*'topk_softmax'"):
        ROUTERS["triton_fused"](torch.zeros(1, too_many), 2)
