"""Router variants: top-k -> softmax equals softmax -> top-k -> renormalise, ties included.

Tie rule (model/moe/router.py): rank by float32 logit, larger first; equal logits -> lower expert id first.
The tests run every router of `ROUTERS` that runs on this CPU; `triton_fused` runs them through Triton's
interpreter (tests/numerics/triton_interpreter_checks.py), and on a GPU in test_moe_gpu.py. The router
property (`check_router`, `router_logit_cases`) lives here for those files and for the mutants of
test_moe_checker_catches_bugs.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from model.moe import ROUTERS, RouterPath, route_reference, route_topk_softmax
from model import tolerances
from tests.numerics.moe_cases import ROUTING_PATTERNS, MoECase, make_router_logits

# What the routers run on here: `triton_fused` only under Triton's interpreter (never on a CUDA-less CPU else).
CPU_ROUTERS = sorted(name for name, path in ROUTERS.items() if path.unavailable_reason("cpu", torch.float32) is None)
LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# How a case's logits are drawn: `few_values` ties everywhere, across the top-k boundary too; `signed_zeros`
# mixes -0.0 and +0.0 (equal, so a tie); `coarse` is normal values rounded to quarters (some ties, many orders).
LOGIT_KINDS = ("random", "few_values", "signed_zeros", "coarse")


@dataclass(frozen=True)
class RouterCase:
    tokens: int
    experts: int
    top_k: int
    dtype: str  # a torch dtype's name: reads well in a shrunk counterexample
    kind: str
    seed: int


@st.composite
def router_logit_cases(
    draw,
    tokens=st.integers(1, 64),
    experts=st.integers(1, 64),
    dtypes=st.sampled_from(LOGIT_DTYPES),
    kinds=st.sampled_from(LOGIT_KINDS),
    top_k=None,  # a strategy; default: 1..E
) -> RouterCase:
    num_experts = draw(experts)
    return RouterCase(
        tokens=draw(tokens),
        experts=num_experts,
        top_k=draw(st.integers(1, num_experts) if top_k is None else top_k),
        dtype=str(draw(dtypes)).removeprefix("torch."),
        kind=draw(kinds),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def make_logits(case: RouterCase, device="cpu") -> torch.Tensor:
    """[T, E] logits of the case's kind, in its dtype (drawn on the CPU: the same values on every device)."""
    g = torch.Generator().manual_seed(case.seed)
    shape = (case.tokens, case.experts)
    if case.kind == "random":
        logits = 3 * torch.randn(shape, generator=g)
    elif case.kind == "few_values":
        logits = torch.randint(0, 3, shape, generator=g).float()
    elif case.kind == "signed_zeros":
        logits = torch.tensor([-0.0, 0.0, -1.0, 1.0])[torch.randint(0, 4, shape, generator=g)]
    elif case.kind == "coarse":
        logits = (4 * torch.randn(shape, generator=g)).round() / 4
    else:
        raise ValueError(f"unknown logit kind {case.kind!r}; one of {LOGIT_KINDS}")
    return logits.to(getattr(torch, case.dtype)).to(device)


def check_router(route, case: RouterCase, device="cpu") -> None:
    """The router's ids equal the reference's exactly and its weights are within float32's bound of the
    reference's and of the float64 specification's (`spec_routing`)."""
    logits = make_logits(case, device)
    weights, ids = route(logits, case.top_k)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64, f"{weights.dtype}, {ids.dtype}"
    assert weights.shape == ids.shape == (case.tokens, case.top_k), f"{tuple(weights.shape)}, {tuple(ids.shape)}"
    ref_w, ref_ids = route_reference(logits, case.top_k)
    bound = tolerances.ROUTER_WEIGHTS[torch.float32]
    assert torch.equal(ids.cpu(), ref_ids.cpu()), f"ids differ from the reference for {case}"
    err = (weights.double() - ref_w.double()).abs().max().item()
    assert err <= bound, f"weights differ from the reference by {err:.2e} > {bound:.0e} for {case}"
    spec_w, spec_ids = spec_routing(logits.float().cpu(), case.top_k)
    assert torch.equal(ids.cpu(), spec_ids), f"ids differ from the specification for {case}"
    err = (weights.double().cpu() - spec_w).abs().max().item()
    assert err <= bound, f"weights differ from the float64 specification by {err:.2e} > {bound:.0e} for {case}"


def run_router_property(route, cases=None, run_settings: settings | None = None, examples=(), device="cpu") -> None:
    """`check_router` for every drawn case (hypothesis shrinks a failure to the smallest case)."""

    @given(case=router_logit_cases() if cases is None else cases)
    def router_matches_reference(case: RouterCase) -> None:
        check_router(route, case, device)

    for case in examples:
        router_matches_reference = example(case=case)(router_matches_reference)
    if run_settings is not None:
        router_matches_reference = run_settings(router_matches_reference)
    router_matches_reference()


# Always checked: top_k = 1 and top_k = E, ties across the boundary, signed zeros, each logit dtype.
EDGE_ROUTER_CASES = (
    RouterCase(tokens=1, experts=1, top_k=1, dtype="float32", kind="random", seed=0),
    RouterCase(tokens=3, experts=17, top_k=1, dtype="bfloat16", kind="few_values", seed=1),
    RouterCase(tokens=3, experts=17, top_k=17, dtype="float16", kind="signed_zeros", seed=2),
    RouterCase(tokens=4, experts=40, top_k=9, dtype="bfloat16", kind="few_values", seed=3),
    RouterCase(tokens=2, experts=33, top_k=5, dtype="float32", kind="signed_zeros", seed=4),
    RouterCase(tokens=5, experts=64, top_k=8, dtype="float16", kind="coarse", seed=5),
)


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


TIE_CASES = [
    ([1.0, 3.0, 3.0, 2.0], 1, [1]),  # tie for first place: lower id
    ([1.0, 3.0, 3.0, 2.0], 2, [1, 2]),
    ([5.0, 2.0, 2.0, 2.0], 2, [0, 1]),  # tie across the top-k boundary: lower id is selected
    ([2.0, 2.0, 2.0, 2.0], 3, [0, 1, 2]),
    ([2.0, 2.0, 2.0, 2.0], 4, [0, 1, 2, 3]),  # top_k = E
    ([0.0, -0.0, 1.0], 2, [2, 0]),  # -0.0 == +0.0 is a tie, not an order
    ([-0.0, 0.0, -0.0, -1.0], 2, [0, 1]),  # ... across the top-k boundary too
    ([-1.0, -0.0, 0.0, 0.0], 3, [1, 2, 3]),
    ([-1e30, -1e30, -3e38], 1, [0]),
]


@given(case=router_cases, k_fraction=st.floats(0.0, 1.0))
def test_router_variants_pick_the_same_experts_with_the_same_weights(case, k_fraction):
    top_k = 1 + int(k_fraction * (case.experts - 1))
    logits = make_router_logits(case)
    ref_w, ref_ids = route_reference(logits, top_k)
    var_w, var_ids = route_topk_softmax(logits, top_k)
    assert torch.equal(var_ids, ref_ids), f"ids differ for {case} k={top_k}"
    err = (var_w.double() - ref_w.double()).abs().max().item()
    assert err <= tolerances.ROUTER_WEIGHTS[torch.float32], f"weights differ by {err:.2e} for {case}"


@pytest.mark.parametrize("router", CPU_ROUTERS)
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


@pytest.mark.parametrize("router", CPU_ROUTERS)
@pytest.mark.parametrize(("logits", "top_k", "expected"), TIE_CASES)
def test_router_tie_rule_selects_lower_expert_id(router, logits, top_k, expected):
    weights, ids = ROUTERS[router](torch.tensor([logits]), top_k)
    assert ids.tolist() == [expected]


@pytest.mark.parametrize("router", CPU_ROUTERS)
def test_router_tied_experts_get_equal_weights(router):
    weights, _ = ROUTERS[router](torch.tensor([[0.5, 0.5, 0.5, -1.0]]), 3)
    assert torch.allclose(weights, torch.full((1, 3), 1 / 3))


@pytest.mark.parametrize("router", CPU_ROUTERS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_router_non_finite_logit_poisons_its_token_only(router, bad):
    logits = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    logits[2, 5] = bad
    weights, _ = ROUTERS[router](logits, 2)
    assert torch.isnan(weights[2]).any(), f"{router} masked a {bad} router logit: {weights[2]}"
    assert torch.isfinite(weights[[0, 1, 3]]).all()


@pytest.mark.parametrize("router", CPU_ROUTERS)
def test_router_rejects_top_k_outside_the_expert_count(router):
    with pytest.raises(ValueError, match="top_k=9 must be between 1 and the number of experts"):
        ROUTERS[router](torch.randn(2, 8), 9)


@pytest.mark.parametrize("router", CPU_ROUTERS)
def test_router_equals_reference_on_ties_signed_zeros_and_each_logit_dtype(router):
    run_router_property(ROUTERS[router], examples=EDGE_ROUTER_CASES)


def test_router_float64_logits_are_ranked_as_float32():
    """Two float64 logits that round to one float32 are a tie: the lower id wins, in every router."""
    logits = torch.tensor([[1.0, 1.0 + 1e-12, 0.5]], dtype=torch.float64)
    for name in CPU_ROUTERS:
        assert ROUTERS[name](logits, 1)[1].tolist() == [[0]], name


def test_routers_are_a_path_table_whose_entries_route():
    """`moe_block(router=name)` calls ROUTERS[name] with (logits, top_k); the table says where each runs."""
    assert ROUTERS.reference.name == "reference"
    assert all(isinstance(path, RouterPath) for path in ROUTERS.values())
    assert all(path.output_dtype(torch.bfloat16) == torch.float32 for path in ROUTERS.values())
    weights, ids = ROUTERS["topk_softmax"](torch.tensor([[0.0, 2.0, 1.0]]), 2)
    assert ids.tolist() == [[1, 2]]
    assert "triton_fused" in ROUTERS


def test_triton_fused_router_names_why_it_cannot_run_on_a_cpu_without_the_interpreter():
    path = ROUTERS["triton_fused"]
    if path.unavailable_reason("cpu", torch.float32) is None:
        pytest.skip("Triton's interpreter is in effect: the router runs on the CPU")
    assert not path.supports(1, torch.float32, "cpu")
    with pytest.raises(ValueError, match="(?i)triton"):
        path(torch.randn(2, 8), 2)
    with pytest.raises(ValueError, match="top_k=9 must be between 1 and the number of experts"):
        path(torch.randn(2, 8), 9)
