"""The property checks can fail: deliberately wrong paths are registered and must be reported, shrunk.

If one of these tests fails, the suite has lost the power to catch that class of bug.
"""
from __future__ import annotations

import re
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, settings

from model.moe import EXPERT_PATHS, ROUTERS, ExpertPath, RouterPath
from model.moe.experts import _group_by_expert, experts_sorted, silu_and_mul
from model.moe.router import route_reference, route_topk_softmax, topk_lowest_id_on_ties
from model import tolerances
from tests.numerics.moe_cases import check_expert_path, make_router_logits, moe_cases
from tests.numerics.test_moe_router import run_router_property

# Failures are expected here: no example database (they must not replay in other tests), fixed seed.
FALSIFY = settings(max_examples=200, derandomize=True, database=None, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow])


def experts_sorted_off_by_one(x, w13, w2, weights, ids, out):
    """`sorted` with the classic slip: each expert's slice starts one slot late."""
    top_k = ids.shape[1]
    order, counts = _group_by_expert(ids, w13.shape[0])
    acc = torch.zeros(x.shape, dtype=torch.float32)
    start = 0
    for e, count in enumerate(counts.tolist()):
        if count:
            slots = order[start + 1 : start + count + 1]
            tokens = slots // top_k
            y = F.linear(silu_and_mul(F.linear(x[tokens], w13[e])), w2[e])
            acc.index_add_(0, tokens, y.float() * weights.reshape(-1)[slots, None])
        start += count
    return out.copy_(acc)


def experts_sorted_without_the_last_expert(x, w13, w2, weights, ids, out):
    """`sorted` that forgets the highest expert id: right unless a token is routed there."""
    keep = ids < w13.shape[0] - 1
    return experts_sorted(x, w13, w2, weights * keep, ids, out)


def falsifying_report(excinfo) -> str:
    report = "\n".join(getattr(excinfo.value, "__notes__", [])) + str(excinfo.value)
    # Hypothesis titles its report "Falsifying example" (older) or "Failing test case" (newer).
    assert re.search(r"Falsifying example|Failing test case", report), f"no hypothesis report in:\n{report}"
    return report


def shrunk_field(report: str, name: str) -> int:
    match = re.search(rf"{name}=(\d+)", report)
    assert match, f"no {name} in the falsifying example:\n{report}"
    return int(match.group(1))


@pytest.mark.parametrize(
    "wrong_fn", [experts_sorted_off_by_one, experts_sorted_without_the_last_expert], ids=["off_by_one", "drops_last_expert"]
)
def test_wrong_expert_path_is_reported_with_a_shrunk_counterexample(wrong_fn):
    wrong = ExpertPath(f"wrong_{wrong_fn.__name__}", wrong_fn, dtypes=(torch.float32,))
    with patch.dict(EXPERT_PATHS, {wrong.name: wrong}):  # registered like any path, then removed
        with pytest.raises(AssertionError) as excinfo:
            check_expert_path(
                EXPERT_PATHS[wrong.name], torch.float32, tolerances.MOE_EXPERT_PATHS["sorted"][torch.float32],
                run_settings=FALSIFY,
            )
    assert wrong.name not in EXPERT_PATHS
    report = falsifying_report(excinfo)
    # Shrinking reaches the smallest input that shows the bug: a single token.
    assert shrunk_field(report, "tokens") == 1, report


def route_without_renormalisation(logits, top_k):
    """The router bug the design warns about: softmax -> top-k, weights not renormalised."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    return weights, ids


def test_router_without_renormalisation_is_reported_with_a_shrunk_counterexample():
    from hypothesis import given
    from hypothesis import strategies as st

    @FALSIFY
    @given(case=moe_cases(tokens=st.integers(1, 64), max_top_k=8))
    def router_matches_reference(case):
        logits = make_router_logits(case)
        want_w, _ = route_topk_softmax(logits, case.top_k)
        got_w, _ = route_without_renormalisation(logits, case.top_k)
        assert torch.allclose(got_w, want_w, atol=tolerances.ROUTER_WEIGHTS[torch.float32]), case

    with pytest.raises(AssertionError) as excinfo:
        router_matches_reference()
    report = falsifying_report(excinfo)
    # Renormalisation only matters when some probability mass lies outside the top-k: two experts, top-1.
    assert shrunk_field(report, "tokens") == 1 and shrunk_field(report, "experts") == 2, report


# --- the router property (tests/numerics/test_moe_router.py: check_router), which every router passes,
# the fused Triton one included: the same property must catch each of these.

def route_higher_id_on_ties(logits, top_k):
    """`topk_softmax` with the tie rule reversed: among equal logits the higher expert id first."""
    weights, flipped_ids = route_topk_softmax(logits.flip(-1), top_k)
    return weights, logits.shape[-1] - 1 - flipped_ids


def route_signed_zero_breaks_ties(logits, top_k):
    """`topk_softmax` without the `+ 0.0`: -0.0 ranks below +0.0 instead of tying with it."""
    top_logits, ids = topk_lowest_id_on_ties(logits.float(), top_k)
    return torch.softmax(top_logits, dim=-1), ids


def route_selected_but_not_renormalised(logits, top_k):
    """The right experts with their full-softmax probabilities: the renormalisation over the k forgotten."""
    _, ids = route_reference(logits, top_k)
    return torch.softmax(logits.float(), dim=-1).gather(-1, ids), ids


@pytest.mark.parametrize(
    ("wrong_fn", "shrunk_kind"),
    [
        (route_higher_id_on_ties, None),  # any kind with ties: few_values or signed_zeros
        (route_signed_zero_breaks_ties, "signed_zeros"),
        (route_selected_but_not_renormalised, None),
    ],
    ids=["higher_id_on_ties", "signed_zero_breaks_ties", "not_renormalised"],
)
def test_wrong_router_is_reported_with_a_shrunk_counterexample(wrong_fn, shrunk_kind):
    wrong = RouterPath(f"wrong_{wrong_fn.__name__}", wrong_fn)
    with patch.dict(ROUTERS, {wrong.name: wrong}):  # registered like any router, then removed
        with pytest.raises(AssertionError) as excinfo:
            run_router_property(ROUTERS[wrong.name], run_settings=FALSIFY)
    assert wrong.name not in ROUTERS
    report = falsifying_report(excinfo)
    # Shrunk to one token and a handful of experts (two show each bug; the drawn seed must also make the tie
    # or the mass outside the top-k, so the shrinker may stop at three or four).
    assert shrunk_field(report, "tokens") == 1 and shrunk_field(report, "experts") <= 4, report
    if shrunk_kind is not None:
        assert f"kind='{shrunk_kind}'" in report, report


def experts_sorted_slightly_off(x, w13, w2, weights, ids, out):
    """`sorted` wrong by 1e-5 relative: five times float32's bound, so the check must see it however the
    error is scaled."""
    return experts_sorted(x, w13, w2, weights, ids, out).mul_(1 + 1e-5)


def test_a_float32_path_wrong_by_1e_5_relative_is_reported():
    wrong = ExpertPath("wrong_slightly_off", experts_sorted_slightly_off, dtypes=(torch.float32,))
    with patch.dict(EXPERT_PATHS, {wrong.name: wrong}):
        with pytest.raises(AssertionError) as excinfo:
            check_expert_path(EXPERT_PATHS[wrong.name], torch.float32,
                              tolerances.MOE_EXPERT_PATHS["sorted"][torch.float32], run_settings=FALSIFY)
    falsifying_report(excinfo)
