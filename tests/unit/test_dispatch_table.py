"""Dispatch tables (model.dispatch.table): file names, loading and its errors, which table a device gets, and
the MoE and GDN dispatchers following a table, falling back to the knobs wherever it has nothing to say."""
from __future__ import annotations

import dataclasses
import json
from unittest.mock import patch

import pytest
import torch

from model.attention.decode_layer import ATTENTION_DECODE_LAYER_PATHS
from model.dispatch import table as table_module
from model.dispatch.nvidia_defaults import NVIDIA_DEFAULT_BLOCKS
from model.dispatch.table import (
    CHECKOUT_TABLE_DIR, DIR_ENV, NVIDIA_DEFAULTS, SCHEMA, TABLE_ENV, DispatchTableError, choose_table,
    clear_table_cache, load_dispatch_table, table_file_name, table_path_for,
)
from model.gdn import (CONV_PATHS, GDN_DECODE_LAYER_PATHS, GDN_RULE_PATHS, GDNState, gdn_layer, select_conv_path,
                       select_gated_norm_path, select_rule_path)
from model.moe import EXPERT_PATHS, MOE_BLOCK_PATHS, MoEConfig, dispatch_experts, select_expert_path
from model.norm.rms_norm import ADD_RMS_NORM_PATHS, GATED_NORM_PATHS
from patches.model_paths import moe_experts
from tests.numerics.gdn_attention_cases import TINY_GDN, generator, random_gdn_weights, randn
from tests.numerics.moe_cases import MoECase, make_hidden, make_moe_weights, make_routing

F32 = torch.float32


def table_json(blocks: dict, dtype: str = "float32", device: str = "cpu") -> dict:
    return {"schema": SCHEMA, "device": device, "dtype": dtype, "recorded": {}, "blocks": blocks}


def ranges(*spans) -> dict:
    return {"keyed_by": "tokens", "ranges": [{"from": lo, "to": hi, "path": p} for lo, hi, p in spans]}


MOE_TABLE = {"moe_experts": ranges((1, 2, "tiny_bmm"), (3, 9, "grouped_mm"), (10, None, "sorted"))}
GDN_TABLE = {"gdn_prefill": ranges((1, None, "recurrent_reference")),
             "gdn_decode": dict(ranges((1, 3, "chunked"), (4, None, "recurrent_reference")), keyed_by="batch")}


@pytest.fixture
def use_table(tmp_path, monkeypatch):
    """Point QWEN36_DISPATCH_TABLE at a table written from `blocks`; the caches are cleared either side."""

    def write(blocks: dict, dtype: str = "float32"):
        path = tmp_path / "table.json"
        path.write_text(json.dumps(table_json(blocks, dtype)))
        monkeypatch.setenv(TABLE_ENV, str(path))
        clear_table_cache()
        return path

    clear_table_cache()
    yield write
    monkeypatch.delenv(TABLE_ENV, raising=False)
    clear_table_cache()


@pytest.fixture(autouse=True)
def no_table_settings(monkeypatch):
    monkeypatch.delenv(TABLE_ENV, raising=False)
    monkeypatch.delenv(DIR_ENV, raising=False)
    clear_table_cache()


def knob_path(tokens: int, config: MoEConfig) -> str:
    """The knobs' rule, restated from model/moe/config.py's table."""
    if not config.native:
        return "reference"
    if tokens == 1 and config.decode_native:
        return "decode_fused"
    if tokens <= config.tiny_max:
        return {"tokenwise": "tiny_tokenwise", "bmm": "tiny_bmm"}[config.tiny_impl]
    return config.prefill_impl


@pytest.mark.parametrize(("name", "file"), [("NVIDIA H200", "nvidia-h200.json"),
                                            ("Iluvatar BI-V100", "iluvatar-bi-v100.json"),
                                            ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3.json")])
def test_device_names_become_file_names(name, file):
    assert table_file_name(name) == file


def test_a_device_name_without_letters_or_digits_is_refused():
    with pytest.raises(DispatchTableError, match="no letters or digits"):
        table_file_name(" -- ")


def test_lookup_inside_between_and_past_the_ranges(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table_json({"moe_experts": ranges((2, 4, "a"), (8, None, "b"))})))
    t = load_dispatch_table(path)
    assert [t.path_for("moe_experts", n, F32) for n in (1, 2, 4, 5, 8, 10**6)] == [None, "a", "a", None, "b", "b"]
    assert t.path_for("gdn_decode", 2, F32) is None, "a block the table lacks"
    assert t.path_for("moe_experts", 2, torch.bfloat16) is None, "measured in float32 only"


@pytest.mark.parametrize(("content", "match"), [
    ("not json", "is not JSON"),
    (json.dumps({"schema": "other", "blocks": {}}), "schema"),
    (json.dumps(table_json({"moe_router": ranges((1, None, "a"))})), "unknown blocks"),
    (json.dumps(table_json({"moe_experts": ranges((1, 4, "a"), (4, None, "b"))})), "overlap"),
    (json.dumps(table_json({"moe_experts": ranges((3, 2, "a"))})), "from <= to"),
    (json.dumps(table_json({"moe_experts": {"ranges": [{"from": 1, "path": "a"}]}})), "needs `from`, `to`"),
    (json.dumps(table_json({"moe_experts": {"ranges": []}})), "non-empty"),
])
def test_broken_tables_are_refused_with_the_file_named(tmp_path, content, match):
    path = tmp_path / "broken.json"
    path.write_text(content)
    with pytest.raises(DispatchTableError, match=match) as info:
        load_dispatch_table(path)
    assert "broken.json" in str(info.value)


def test_which_table_a_device_gets(tmp_path):
    (tmp_path / "nvidia-h200.json").write_text(json.dumps(table_json(MOE_TABLE, "bfloat16", "NVIDIA H200")))
    own = choose_table("NVIDIA H200", {DIR_ENV: str(tmp_path)})
    assert own.table is not None and own.table.device == "NVIDIA H200" and "nvidia-h200.json" in own.detail
    missing = choose_table("NVIDIA H100", {DIR_ENV: str(tmp_path)})
    assert missing.table is None and "nvidia-h100.json is missing" in missing.detail
    gone = choose_table("NVIDIA H200", {DIR_ENV: str(tmp_path / "nowhere")})
    assert gone.table is None and "does not exist" in gone.detail and DIR_ENV in gone.detail
    cpu = choose_table(None, {DIR_ENV: str(tmp_path)})
    assert cpu.table is None and "CPU" in cpu.detail
    off = choose_table("NVIDIA H200", {DIR_ENV: str(tmp_path), TABLE_ENV: "off"})
    assert off.table is None and "off" in off.detail
    forced = choose_table(None, {TABLE_ENV: str(tmp_path / "nvidia-h200.json")})
    assert forced.table is not None and TABLE_ENV in forced.detail


BLOCK_PATHS = {"moe_experts": EXPERT_PATHS, "moe_block": MOE_BLOCK_PATHS, "gdn_prefill": GDN_RULE_PATHS,
               "gdn_decode": GDN_RULE_PATHS, "gdn_layer_decode": GDN_DECODE_LAYER_PATHS, "gdn_conv": CONV_PATHS,
               "gdn_gated_norm": GATED_NORM_PATHS, "attention_layer_decode": ATTENTION_DECODE_LAYER_PATHS,
               "add_rms_norm": ADD_RMS_NORM_PATHS}
H100 = "NVIDIA H100 80GB HBM3"


def test_an_nvidia_gpu_gets_the_nvidia_defaults_where_its_table_has_no_row(tmp_path):
    missing = choose_table(H100, {DIR_ENV: str(tmp_path)})
    assert missing.table is None and missing.fallback is NVIDIA_DEFAULTS
    assert "NVIDIA defaults" in missing.detail and "record one with `qwen36 tune`" in missing.detail
    (tmp_path / "nvidia-h200.json").write_text(json.dumps(table_json(MOE_TABLE, "bfloat16", "NVIDIA H200")))
    own = choose_table("NVIDIA H200", {DIR_ENV: str(tmp_path)})
    assert own.table is not None and own.fallback is NVIDIA_DEFAULTS and "NVIDIA defaults" in own.detail
    platform = choose_table("Iluvatar BI-V100", {DIR_ENV: str(tmp_path)})
    assert platform.fallback is None and "knobs decide" in platform.detail, "only NVIDIA GPUs: the BI-V100's knobs"
    off = choose_table(H100, {DIR_ENV: str(tmp_path), TABLE_ENV: "off"})
    assert off.table is None and off.fallback is None, "off means the knobs, defaults included"
    assert choose_table(None, {DIR_ENV: str(tmp_path)}).fallback is None, "a CPU never"


def _on_an_h100(monkeypatch, table_dir):
    monkeypatch.setenv(DIR_ENV, str(table_dir))
    monkeypatch.setattr(table_module, "_cuda_device_name", lambda index: H100)
    clear_table_cache()


def test_the_dispatchers_of_an_nvidia_gpu_without_a_table_serve_the_defaults(tmp_path, monkeypatch):
    _on_an_h100(monkeypatch, tmp_path)
    for block, spans in NVIDIA_DEFAULT_BLOCKS.items():
        for low, high, path in spans:
            for n in (low, high or 4 * low):
                assert table_path_for(block, n, "cuda:0", torch.bfloat16, lambda name: True) == path, (block, n)
    assert table_path_for("moe_experts", 1, "cuda:0", torch.float32, lambda name: True) is None, "bf16 only"
    assert table_path_for("gdn_prefill", 64, "cuda:0", torch.bfloat16, lambda name: name != "fla_chunk") is None, \
        "a default that cannot run (no fla-core) leaves the knobs to decide"


def test_a_row_of_the_gpus_own_table_wins_and_a_block_it_lacks_takes_the_default(tmp_path, monkeypatch):
    (tmp_path / table_file_name(H100)).write_text(json.dumps(table_json(
        {"moe_experts": ranges((1, None, "tiny_bmm"))}, "bfloat16", H100)))
    _on_an_h100(monkeypatch, tmp_path)
    assert table_path_for("moe_experts", 1, "cuda:0", torch.bfloat16, lambda name: True) == "tiny_bmm"
    assert table_path_for("gdn_layer_decode", 8, "cuda:0", torch.bfloat16, lambda name: True) == "triton"
    assert table_path_for("moe_experts", 1, "cuda:0", torch.bfloat16, lambda name: name != "tiny_bmm") == \
        "triton_decode", "a row that cannot run the input gives way to the default"


def test_the_nvidia_defaults_are_registered_paths_and_the_recorded_nvidia_tables_choices():
    tables = [load_dispatch_table(p) for p in sorted(CHECKOUT_TABLE_DIR.glob("nvidia-*.json"))]
    assert tables, "the defaults come from the NVIDIA tables in fixtures/dispatch"
    for block, spans in NVIDIA_DEFAULT_BLOCKS.items():
        assert set(BLOCK_PATHS[block]) >= {path for _, _, path in spans}, f"{block}: a default is not registered"
        for low, high, path in spans:
            for n in sorted({low, high or low, *(2**p for p in range(15) if low <= 2**p <= (high or 2**14))}):
                recorded = {t.path_for(block, n, None) for t in tables} - {None}
                if len(recorded) == 1:  # where the NVIDIA tables agree, the default is their choice
                    assert recorded == {path}, f"{block} at {n}: the tables serve {recorded}, the default {path}"


def test_a_table_setting_naming_no_file_is_an_error():
    with pytest.raises(DispatchTableError, match=TABLE_ENV):
        choose_table(None, {TABLE_ENV: "/no/such/table.json"})


def test_the_default_directory_is_the_checkouts_fixtures():
    assert CHECKOUT_TABLE_DIR.parts[-2:] == ("fixtures", "dispatch")
    assert (CHECKOUT_TABLE_DIR.parent.parent / "model" / "dispatch" / "table.py").is_file()


@pytest.mark.parametrize("config", [MoEConfig(), MoEConfig(tiny_impl="bmm", tiny_max=8, prefill_impl="grouped_mm"),
                                    MoEConfig(decode_native=False)])
def test_cpu_without_a_table_keeps_the_knobs_exactly(config):
    for tokens in (1, 2, 4, 5, 8, 9, 64, 4096):
        assert select_expert_path(tokens, config, "cpu", F32) == knob_path(tokens, config)
        assert select_expert_path(tokens, config) == knob_path(tokens, config)


def test_moe_follows_the_table_and_falls_back_outside_it(use_table):
    use_table(MOE_TABLE)
    config = MoEConfig()
    want = {1: "tiny_bmm", 2: "tiny_bmm", 3: "grouped_mm", 9: "grouped_mm", 10: "sorted", 5000: "sorted"}
    for tokens, path in want.items():
        assert select_expert_path(tokens, config, "cpu", F32) == path
    assert select_expert_path(1, MoEConfig(native=False), "cpu", F32) == "reference", "MOE_NATIVE=0 still wins"
    assert select_expert_path(3, config, "cpu", torch.float64) == knob_path(3, config), "dtype not measured"
    assert select_expert_path(3, config) == knob_path(3, config), "no device given: the knobs"


def test_a_table_path_that_cannot_run_the_input_falls_back_to_the_knobs(use_table):
    use_table({"moe_experts": ranges((1, 4, "no_such_path"), (5, None, "decode_fused"))})
    assert select_expert_path(2, MoEConfig(), "cpu", F32) == knob_path(2, MoEConfig()), "unregistered"
    assert select_expert_path(6, MoEConfig(), "cpu", F32) == knob_path(6, MoEConfig()), "decode_fused is T == 1"


def test_dispatch_experts_runs_the_tables_path(use_table):
    use_table(MOE_TABLE)
    calls = []
    spies = {n: dataclasses.replace(p, fn=lambda *a, _f=p.fn, _n=n: (calls.append(_n), _f(*a))[1])
             for n, p in EXPERT_PATHS.items()}
    case = MoECase(3, experts=8, top_k=2, hidden=16, intermediate=8, shared_intermediate=8, pattern="random", seed=0)
    x, w = make_hidden(case, F32), make_moe_weights(case, F32)
    weights, ids = make_routing(case)
    with patch.dict(EXPERT_PATHS, spies):
        dispatch_experts(x, w.w13, w.w2, weights, ids, MoEConfig())
    assert calls == ["grouped_mm"]


def test_gdn_follows_the_table_by_batch_for_decode_and_tokens_for_prefill(use_table):
    assert select_rule_path(1, 8, "cpu", F32) == "decode_step" and select_rule_path(9, 1, "cpu", F32) == "chunked"
    use_table(GDN_TABLE)
    assert select_rule_path(1, 2, "cpu", F32) == "chunked"
    assert select_rule_path(1, 4, "cpu", F32) == "recurrent_reference"
    assert select_rule_path(7, 1, "cpu", F32) == "recurrent_reference"
    assert select_rule_path(7) == "chunked", "no device given: the token-count rule"


def test_the_gdn_layer_runs_the_tables_rule_path(use_table):
    use_table({"gdn_prefill": ranges((1, None, "recurrent_reference"))})
    calls = []
    spies = {n: dataclasses.replace(p, fn=lambda *a, _f=p.fn, _n=n: (calls.append(_n), _f(*a))[1])
             for n, p in GDN_RULE_PATHS.items()}
    gen = generator(0)
    w = random_gdn_weights(gen, TINY_GDN, F32)
    with patch.dict(GDN_RULE_PATHS, spies):
        gdn_layer(randn(gen, 1, 3, TINY_GDN.hidden_size), w, GDNState.zeros(1, TINY_GDN, F32))
        gdn_layer(randn(gen, 1, 1, TINY_GDN.hidden_size), w, GDNState.zeros(1, TINY_GDN, F32))
    assert calls == ["recurrent_reference", "decode_step"], "prefill from the table, decode from the default"


def test_the_plugin_status_names_the_table(use_table, tmp_path, monkeypatch):
    monkeypatch.setattr(moe_experts, "_device_name", lambda: None)  # vLLM's platform would name the GPU
    path = use_table(MOE_TABLE)
    assert str(path) in moe_experts._table_detail()
    monkeypatch.delenv(TABLE_ENV)
    (tmp_path / "nvidia-h200.json").write_text(json.dumps(table_json(MOE_TABLE, "bfloat16", "NVIDIA H200")))
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    monkeypatch.setattr(moe_experts, "_device_name", lambda: "NVIDIA H200")
    assert str(tmp_path / "nvidia-h200.json") in moe_experts._table_detail()
    monkeypatch.setattr(moe_experts, "_device_name", lambda: None)
    assert "CPU" in moe_experts._table_detail()
    monkeypatch.setenv(TABLE_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(DispatchTableError, match=TABLE_ENV):  # the status row then reads `failed`, with this
        moe_experts._table_detail()


def test_without_a_table_the_gdn_conv_and_gated_norm_keep_their_defaults():
    for device, dtype in ((None, None), ("cpu", F32), ("cpu", torch.bfloat16)):
        assert [select_conv_path(t, device, dtype) for t in (1, 2, 64, 16384)] == ["update"] + ["prefill"] * 3
        assert {select_gated_norm_path(n, device, dtype) for n in (1, 8, 16384)} == {"fused"}


def test_a_table_recorded_before_the_stage_blocks_serves_their_defaults(use_table):
    use_table(GDN_TABLE)
    assert (select_conv_path(1, "cpu", F32), select_conv_path(64, "cpu", F32)) == ("update", "prefill")
    assert select_gated_norm_path(64, "cpu", F32) == "fused"


# Keyed so that a conv read by rows, or a norm read by tokens per sequence, would pick another path.
STAGE_TABLE = {"gdn_conv": ranges((1, 1, "prefill"), (2, 2, "update"), (3, 4, "reference"), (5, None, "triton")),
               "gdn_gated_norm": ranges((1, 5, "fused"), (6, None, "reference"))}


def test_the_gdn_conv_and_gated_norm_follow_the_table_where_its_path_can_run(use_table):
    use_table(STAGE_TABLE)
    assert select_conv_path(1, "cpu", F32) == "prefill"
    assert select_conv_path(4, "cpu", F32) == "reference"
    assert select_conv_path(2, "cpu", F32) == "prefill", "update takes one token: the default"
    assert select_conv_path(10, "cpu", F32) == "prefill", "triton needs CUDA (or the interpreter): the default"
    assert select_conv_path(4, "cpu", torch.bfloat16) == "prefill", "a dtype the table was not measured in"
    assert select_conv_path(4) == "prefill", "no device given: the default"
    assert [select_gated_norm_path(n, "cpu", F32) for n in (5, 6, 10**6)] == ["fused", "reference", "reference"]


def test_the_staged_gdn_layer_runs_the_tables_conv_by_tokens_and_its_gated_norm_by_rows(use_table):
    use_table(STAGE_TABLE)
    calls = []

    def spy(table):
        return {n: dataclasses.replace(p, fn=lambda *a, _f=p.fn, _n=n: (calls.append(_n), _f(*a))[1])
                for n, p in table.items()}

    gen = generator(0)
    w = random_gdn_weights(gen, TINY_GDN, F32)
    with patch.dict(CONV_PATHS, spy(CONV_PATHS)), patch.dict(GATED_NORM_PATHS, spy(GATED_NORM_PATHS)):
        gdn_layer(randn(gen, 2, 3, TINY_GDN.hidden_size), w)  # T = 3 per sequence, 6 rows
        gdn_layer(randn(gen, 1, 2, TINY_GDN.hidden_size), w)  # T = 2, 2 rows: update cannot take it
        gdn_layer(randn(gen, 2, 1, TINY_GDN.hidden_size), w)  # one token: the decode layer's `staged`, 2 rows
        gdn_layer(randn(gen, 2, 3, TINY_GDN.hidden_size), w, conv="prefill", norm="fused")  # forced
    assert calls == ["reference", "reference", "prefill", "fused", "prefill", "fused", "prefill", "fused"], calls
