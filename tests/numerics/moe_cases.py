"""Hypothesis strategies for MoE inputs, and the property checks every expert path and router must pass.

A case is drawn as small integers (shape, routing pattern, seed) and turned into tensors by a seeded
torch generator: each example gets fresh random values, and a failure shrinks to the smallest shape.
The checks are plain functions so that a test can also run them on a deliberately wrong path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import example, given, note, settings
from hypothesis import strategies as st

import torch.nn.functional as F

from model.dispatch.paths import ComputePath
from model.moe import MoEConfig, MoEWeights, moe_block_reference, route_reference, shared_expert
from model.moe.experts import ExpertPath, experts_magnitude, experts_reference
from tests.numerics.compare import poisoned_like, relative_error

# Dispatcher knobs the CPU can run (no Triton, no CUDA-only path): for properties of the whole block.
MOE_CONFIGS = st.builds(
    MoEConfig,
    native=st.booleans(),
    decode_native=st.booleans(),
    tiny_impl=st.sampled_from(["tokenwise", "bmm"]),
    tiny_max=st.integers(0, 16),
    prefill_impl=st.sampled_from(["sorted", "grouped_mm"]),
)

# Routing patterns, as router-logit recipes (see `make_router_logits`).
ROUTING_PATTERNS = ("random", "skewed", "one_expert", "empty_experts", "ties")
# The patterns a whole block can be given through its router weights (see `make_block_weights`).
BLOCK_ROUTING_PATTERNS = ("random", "skewed", "ties")


@dataclass(frozen=True)
class MoECase:
    tokens: int
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    shared_intermediate: int
    pattern: str
    seed: int


@st.composite
def moe_cases(
    draw,
    tokens=st.integers(1, 300),
    experts=st.integers(1, 64),
    max_top_k: int = 8,
    top_k=None,
    hidden=st.integers(4, 64),
    intermediate=st.integers(1, 48),
    shared_intermediate=None,
    patterns=st.sampled_from(ROUTING_PATTERNS),
) -> MoECase:
    num_experts = draw(experts)
    pattern = draw(patterns)
    # `empty_experts` silences half of the experts, so top-k must fit in the other half.
    k_max = min(max_top_k, num_experts if pattern != "empty_experts" else max(1, num_experts - num_experts // 2))
    inter = draw(intermediate)
    return MoECase(
        tokens=draw(tokens),
        experts=num_experts,
        top_k=draw(top_k if top_k is not None else st.integers(1, k_max)),
        hidden=draw(hidden),
        intermediate=inter,
        shared_intermediate=draw(shared_intermediate) if shared_intermediate is not None else inter,
        pattern=pattern,
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _generator(case: MoECase, salt: int, device="cpu") -> torch.Generator:
    # Generated on the target device: the real model's expert weights are 200 M values per case.
    return torch.Generator(device=device).manual_seed(case.seed * 8 + salt)


def make_router_logits(case: MoECase) -> torch.Tensor:
    """float32 [T, E] router logits realising the case's routing pattern."""
    g = _generator(case, 1)
    shape = (case.tokens, case.experts)
    logits = torch.randn(shape, generator=g)
    if case.pattern == "skewed":
        # A few experts attract most tokens, as real routers do under load imbalance.
        logits = logits + torch.linspace(6.0, 0.0, case.experts)[torch.randperm(case.experts, generator=g)]
    elif case.pattern == "one_expert":
        logits[:, int(torch.randint(case.experts, (1,), generator=g))] += 100.0
    elif case.pattern == "empty_experts":
        silent = torch.randperm(case.experts, generator=g)[: case.experts // 2]
        logits[:, silent] = -1e4
    elif case.pattern == "ties":
        # Three distinct values: exact ties everywhere, including across the top-k boundary.
        logits = torch.randint(0, 3, shape, generator=g).float()
    return logits


def make_moe_weights(case: MoECase, dtype: torch.dtype, device="cpu") -> MoEWeights:
    """Random weights scaled so activations stay O(1) whatever the shape."""
    g = _generator(case, 2, device)
    e, h, i, s = case.experts, case.hidden, case.intermediate, case.shared_intermediate

    def rand(*shape, fan_in):
        return (torch.randn(shape, generator=g, device=device) / fan_in**0.5).to(dtype)

    return MoEWeights(
        router=rand(e, h, fan_in=h) * 4,
        w13=rand(e, 2 * i, h, fan_in=h),
        w2=rand(e, h, i, fan_in=i),
        shared_w1=rand(s, h, fan_in=h),
        shared_w3=rand(s, h, fan_in=h),
        shared_w2=rand(h, s, fan_in=s),
        shared_gate=rand(1, h, fan_in=h),
        top_k=case.top_k,
    )


def make_hidden(case: MoECase, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    g = _generator(case, 3, device)
    return torch.randn(case.tokens, case.hidden, generator=g, device=device).to(dtype)


def make_routing(case: MoECase, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = route_reference(make_router_logits(case), case.top_k)
    return weights.to(device), ids.to(device)


def expert_path_error(path: ExpertPath, case: MoECase, dtype: torch.dtype, device="cpu") -> float:
    """Error of `path` against the float64 reference on the same (rounded) inputs, relative to the size of the
    terms it sums (model.moe.experts.experts_magnitude): an output that nearly cancels measures the case, not
    the path."""
    w = make_moe_weights(case, dtype, device)
    x = make_hidden(case, dtype, device)
    weights, ids = make_routing(case, device)
    out = path.fn(x, w.w13, w.w2, weights, ids, poisoned_like(x.shape, dtype, device))
    ref = experts_reference(x, w.w13, w.w2, weights, ids, poisoned_like(x.shape, torch.float64, device))
    assert out.dtype == dtype and out.shape == x.shape, f"{path.name} returned {out.dtype} {tuple(out.shape)}"
    return relative_error(out, ref, scale=experts_magnitude(x, w.w13, w.w2, weights, ids))


def check_expert_path(
    path: ExpertPath,
    dtype: torch.dtype,
    bound: float,
    device="cpu",
    cases=None,
    run_settings: settings | None = None,
    examples: tuple[MoECase, ...] = (),
) -> None:
    """Property: for every drawn case the path is within `bound` of the float64 reference.

    Raises hypothesis's failure (with the shrunk case in its notes) when the path is wrong.
    """
    if cases is None:
        cases = moe_cases(tokens=st.integers(path.min_tokens, min(path.max_tokens or 300, 300)))
    _within_bound_for_every_case(
        path.name, lambda case: expert_path_error(path, case, dtype, device), dtype, bound, cases, run_settings, examples
    )


def _within_bound_for_every_case(name, error_of, dtype, bound, cases, run_settings, examples) -> None:
    """The property behind check_expert_path and check_block_path: error_of(case) <= bound for every case."""

    @given(case=cases)
    def path_matches_reference(case: MoECase) -> None:
        err = error_of(case)
        note(f"{name} {dtype}: relative error {err:.3e}")
        assert err <= bound, f"{name} {dtype}: relative error {err:.3e} > {bound:.1e} for {case}"

    for case in examples:
        path_matches_reference = example(case=case)(path_matches_reference)
    if run_settings is not None:
        path_matches_reference = run_settings(path_matches_reference)
    path_matches_reference()


def block_reference(x: torch.Tensor, w: MoEWeights) -> tuple[torch.Tensor, float]:
    """Float64 block routed by the same low-precision logits the block under test sees, and its scale.

    The block is routed + shared, two terms that can cancel; rounding is proportional to the terms, so
    errors are measured against ||routed|| + ||shared|| rather than ||routed + shared||.
    """
    routing = route_reference(F.linear(x, w.router), w.top_k)
    ref = moe_block_reference(x, w, routing=routing)
    shared = shared_expert(x.double(), w.to(torch.float64))
    return ref, (ref - shared).norm().item() + shared.norm().item()


def make_block_weights(case: MoECase, dtype: torch.dtype, device="cpu") -> MoEWeights:
    """`make_moe_weights`, with router rows that give the case's routing pattern through x @ router.T (a block
    routes its own logits): `ties`: each expert's row is one of two random rows or zeros, so every token has
    exact ties (the zero rows' logits are exactly 0), across the top-k boundary too; `skewed`: row norms spread
    over 1..8x, so a few experts win most tokens. Other patterns keep the random router."""
    w = make_moe_weights(case, dtype, device)
    g = _generator(case, 4, device)
    router = w.router
    if case.pattern == "ties":
        choices = torch.cat([router[:2], torch.zeros_like(router[:1])])
        router = choices[torch.randint(0, len(choices), (case.experts,), generator=g, device=device)]
    elif case.pattern == "skewed":
        scale = torch.linspace(8.0, 1.0, case.experts, device=device)[torch.randperm(case.experts, generator=g, device=device)]
        router = (router.double() * scale[:, None]).to(dtype)
    return MoEWeights(**{**w.tensors(), "router": router.contiguous()}, top_k=w.top_k)


def block_path_error(
    path: ComputePath, case: MoECase, dtype: torch.dtype, device="cpu", config: MoEConfig | None = None,
    router: str = "topk_softmax",
) -> float:
    """Error of a block path (model.moe.MOE_BLOCK_PATHS) against the float64 block routed by the same
    low-precision logits, relative to the size of its two terms (block_reference)."""
    w = make_block_weights(case, dtype, device)
    x = make_hidden(case, dtype, device)
    out = path.fn(x, w, MoEConfig() if config is None else config, router)
    want = (path.output_dtype(dtype), tuple(x.shape))
    assert (out.dtype, tuple(out.shape)) == want, f"{path.name} returned {out.dtype} {tuple(out.shape)}, not {want}"
    ref, scale = block_reference(x, w)
    return relative_error(out, ref, scale=scale)


def check_block_path(
    path: ComputePath,
    dtype: torch.dtype,
    bound: float,
    device="cpu",
    cases=None,
    run_settings: settings | None = None,
    examples: tuple[MoECase, ...] = (),
) -> None:
    """Property: for every drawn case the block path is within `bound` of the float64 block (the block's
    counterpart of `check_expert_path`; raises hypothesis's failure when the path is wrong)."""
    if cases is None:
        cases = moe_cases(tokens=st.integers(path.min_tokens, min(path.max_tokens or 64, 64)),
                          patterns=st.sampled_from(BLOCK_ROUTING_PATTERNS))
    _within_bound_for_every_case(
        path.name, lambda case: block_path_error(path, case, dtype, device), dtype, bound, cases, run_settings, examples
    )
