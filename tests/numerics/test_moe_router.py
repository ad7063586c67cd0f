"""Router variants: top-k -> softmax equals softmax -> top-k -> renormalise, ties included.

Tie rule (model/moe/router.py): rank by float32 logit, larger first; equal logits -> lower expert id first.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from model.moe import ROUTERS, route_reference, route_topk_softmax
from model import tolerances
from tests.numerics.moe_cases import ROUTING_PATTERNS, MoECase, make_router_logits

router_cases = st.builds(
    MoECase,
    tokens=st.integers(1, 64),
    experts=st.integers(1, 64),
    top_k=st.just(1),
    hidden=st.just(4),
    intermediate=st.just(1),
    shared_intermediate=st.just(1),
    pattern=st.sampled_from(ROUTING_PATTERNS),
    seed=st.integers(0, 2**31 - 1),
)


def spec_routing(logits: torch.Tensor, top_k: int):
    """The specification, independently: python sort by (-logit, id), float64 softmax, renormalise."""
    weights, ids = [], []
    for row in logits.tolist():
        order = sorted(range(len(row)), key=lambda e: (-row[e], e))[:top_k]
        peak = max(row)
        exp = [math.exp(v - peak) for v in row]
        total = sum(exp)
        picked = [exp[e] / total for e in order]
        weights.append([p / sum(picked) for p in picked])
        ids.append(order)
    return torch.tensor(weights, dtype=torch.float64), torch.tensor(ids)


@given(case=router_cases, k_fraction=st.floats(0.0, 1.0))
def test_router_variants_pick_the_same_experts_with_the_same_weights(case, k_fraction):
    top_k = 1 + int(k_fraction * (case.experts - 1))
    logits = make_router_logits(case)
    ref_w, ref_ids = route_reference(logits, top_k)
    var_w, var_ids = route_topk_softmax(logits, top_k)
    assert torch.equal(var_ids, ref_ids), f"ids differ for {case} k={top_k}"
    err = (var_w.double() - ref_w.double()).abs().max().item()
    assert err <= tolerances.ROUTER_WEIGHTS[torch.float32], f"weights differ by {err:.2e} for {case}"


@pytest.mark.parametrize("router", sorted(ROUTERS))
@given(case=router_cases, k_fraction=st.floats(0.0, 1.0))
def test_router_equals_the_float64_specification(router, case, k_fraction):
    top_k = 1 + int(k_fraction * (case.experts - 1))
    logits = make_router_logits(case)
    weights, ids = ROUTERS[router](logits, top_k)
    spec_w, spec_ids = spec_routing(logits, top_k)
    assert torch.equal(ids, spec_ids)
    assert weights.dtype == torch.float32
    assert (weights.double() - spec_w).abs().max().item() <= 1e-6
    assert torch.allclose(weights.sum(-1).double(), torch.ones(case.tokens, dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("router", sorted(ROUTERS))
@pytest.mark.parametrize(
    ("logits", "top_k", "expected"),
    [
        ([1.0, 3.0, 3.0, 2.0], 1, [1]),  # tie for first place: lower id
        ([1.0, 3.0, 3.0, 2.0], 2, [1, 2]),
        ([5.0, 2.0, 2.0, 2.0], 2, [0, 1]),  # tie across the top-k boundary: lower id is selected
        ([2.0, 2.0, 2.0, 2.0], 3, [0, 1, 2]),
        ([0.0, -0.0, 1.0], 2, [2, 0]),  # -0.0 == +0.0 is a tie, not an order
        ([-1e30, -1e30, -3e38], 1, [0]),
    ],
)
def test_router_tie_rule_selects_lower_expert_id(router, logits, top_k, expected):
    weights, ids = ROUTERS[router](torch.tensor([logits]), top_k)
    assert ids.tolist() == [expected]


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_router_tied_experts_get_equal_weights(router):
    weights, _ = ROUTERS[router](torch.tensor([[0.5, 0.5, 0.5, -1.0]]), 3)
    assert torch.allclose(weights, torch.full((1, 3), 1 / 3))


@pytest.mark.parametrize("router", sorted(ROUTERS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_router_non_finite_logit_poisons_its_token_only(router, bad):
    logits = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    logits[2, 5] = bad
    weights, _ = ROUTERS[router](logits, 2)
    assert torch.isnan(weights[2]).any(), f"{router} masked a {bad} router logit: {weights[2]}"
    assert torch.isfinite(weights[[0, 1, 3]]).all()


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_router_rejects_top_k_outside_the_expert_count(router):
    with pytest.raises(ValueError, match="top_k=9 must be between 1 and the number of experts"):
        ROUTERS[router](torch.randn(2, 8), 9)
