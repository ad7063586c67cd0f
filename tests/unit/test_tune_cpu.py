"""`qwen36 tune` end to end on a CPU at tiny dims (eager only): it checks and times every available path,
writes a report and a dispatch table, and the dispatchers then follow that table."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from harness.cli import main
from model.attention.decode_layer import select_attention_decode_layer_path
from model.dispatch.table import TABLE_ENV, clear_table_cache, load_dispatch_table
from model.gdn import select_conv_path, select_gated_norm_path, select_rule_path
from model.moe import MoEConfig, select_expert_path
from model.norm.rms_norm import select_add_rms_norm_path

MOE_POINTS, BLOCK_POINTS, PREFILL_POINTS, DECODE_POINTS = (1, 3, 16), (1,), (64,), (1, 4)
CONV_POINTS, NORM_ROWS = (1, 64), (1, 4, 64)  # one token and the prefill points; the norms' rows add the batches
STEP_BLOCKS = (("attention_layer_decode", DECODE_POINTS), ("add_rms_norm", NORM_ROWS))  # the attention at the batches
HAS_VLLM = importlib.util.find_spec("vllm") is not None  # without vLLM's CPU build, no vLLM paths to time
# Why our Triton paths do not run here: Triton compiles for CUDA, and without vLLM's CPU build (which brings it) it
# is absent (fla-core's paths say CUDA either way)
WHY_NO_TRITON = "CUDA" if importlib.util.find_spec("triton") else "Triton is not installed"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune")
    code = main(["tune", "--device", "cpu", "--dims", "tiny", "--reps", "1", "--warmup", "0", "--no-progress",
                 "--prune-factor", "1e9",  # time every path at every point: the test checks the choice
                 "--moe-tokens", ",".join(map(str, MOE_POINTS)), "--moe-block-tokens", ",".join(map(str, BLOCK_POINTS)),
                 "--gdn-prefill-tokens", ",".join(map(str, PREFILL_POINTS)),
                 "--gdn-decode-batches", ",".join(map(str, DECODE_POINTS)), "--report-dir", str(out)])
    return code, out, json.loads((out / "tune.json").read_text())


def fastest(rows, block, key, vllm: bool = False):
    """The rule the table must follow, restated: the lowest eager median among rows whose check passed, of the
    model's paths (`vllm`: vLLM's own layer among them)."""
    ok = [r for r in rows if r["block"] == block and r["key"] == key and r["status"] == "ok"
          and (vllm or r["path"] != "vllm")]
    return min(ok, key=lambda r: r["eager"]["median_us"])["path"]


def test_the_command_checks_every_available_path_and_writes_its_files(tuned):
    code, out, report = tuned
    assert code == 0
    assert {(out / f).is_file() for f in ("tune.json", "tune.md", "cpu.json")} == {True}
    rows = report["rows"]
    for block, points in (("moe_experts", MOE_POINTS), ("moe_block", BLOCK_POINTS), ("gdn_prefill", PREFILL_POINTS),
                          ("gdn_decode", DECODE_POINTS), ("gdn_conv", CONV_POINTS), ("gdn_gated_norm", NORM_ROWS),
                          *STEP_BLOCKS):
        assert {r["key"] for r in rows if r["block"] == block} == set(points), block
    ok = [r for r in rows if r["status"] == "ok" and r["bound"] is not None and r["block"] in
          ("moe_experts", "moe_block", "gdn_prefill", "gdn_decode", "gdn_conv", "gdn_gated_norm",
           "attention_layer_decode", "add_rms_norm")]
    assert ok and all(r["err_eager"] <= r["bound"] for r in ok)
    # the step's other blocks: every path this CPU runs compiled-Triton-free, each checked (triton needs CUDA here)
    # (where vLLM imports, as with `make venv`, the add + RMSNorm is timed against vLLM's own GemmaRMSNorm too)
    norm_paths = {"fused", "vllm"} if HAS_VLLM else {"fused"}
    for block, points in STEP_BLOCKS:
        here = [r for r in rows if r["block"] == block]
        assert {r["path"] for r in here} == ({"staged"} if block == "attention_layer_decode" else norm_paths), here
        assert all(r["status"] == "ok" for r in here), here
    for block, points in (("gdn_gated_norm", NORM_ROWS), ("moe_block", BLOCK_POINTS)):  # vLLM's own, checked
        own = [r for r in rows if r["block"] == block and r["path"] == "vllm"]
        assert {r["key"] for r in own} == (set(points) if HAS_VLLM else set()), own
        assert all(r["status"] == "ok" for r in own), own
    assert any("attention decode layer path triton" in n and WHY_NO_TRITON in n for n in report["notes"]), \
        report["notes"]
    assert {(r["key"], r["path"]) for r in rows if r["block"] == "gdn_conv"} == \
        {(1, "update"), (1, "prefill"), (64, "prefill")}, "update takes one token; triton needs CUDA here"
    assert any("conv path triton" in n and WHY_NO_TRITON in n for n in report["notes"]), report["notes"]
    assert {r["path"] for r in rows if r["block"] == "moe_experts" and r["key"] == 16} >= {"sorted", "tiny_bmm"}
    assert all(r["graph"] is None and "no CUDA graphs" in r["graph_note"] for r in ok)
    assert any("fla_recurrent" in n and "CUDA" in n for n in report["notes"]), report["notes"]
    stages = {r["path"] for r in rows if r["block"] == "gdn_layer_decode"}
    assert stages == {"in_proj", "conv", "gating", "rule", "gated_norm", "out_proj", "layer"}
    # the routers alone, at the block's points: every one that runs on this CPU, each checked against the reference
    routers = [r for r in rows if r["block"] == "moe_router"]
    assert {(r["key"], r["path"]) for r in routers} == {(k, "topk_softmax") for k in BLOCK_POINTS}
    assert all(r["status"] == "ok" for r in routers) and "Router alone" in (out / "tune.md").read_text()


def test_the_table_holds_the_fastest_correct_path_at_each_point(tuned):
    _, out, report = tuned
    table = load_dispatch_table(out / "cpu.json")
    rows = report["rows"]
    for block, points in (("moe_experts", MOE_POINTS), ("gdn_prefill", PREFILL_POINTS), ("gdn_decode", DECODE_POINTS),
                          ("gdn_conv", CONV_POINTS), ("gdn_gated_norm", NORM_ROWS), *STEP_BLOCKS):
        for key in points:
            source = "moe_block" if block == "moe_experts" and key in BLOCK_POINTS else block
            assert table.path_for(block, key, torch.float32) == fastest(rows, source, key), (block, key)


def test_the_table_says_where_vllms_own_layer_was_faster(tuned):
    _, out, report = tuned
    table = load_dispatch_table(out / "cpu.json")
    rows = report["rows"]
    for block, points in (("add_rms_norm", NORM_ROWS), ("gdn_gated_norm", NORM_ROWS), ("moe_block", BLOCK_POINTS)):
        for key in points:
            assert table.vllm_faster_at(block, key, torch.float32) == (fastest(rows, block, key, vllm=True) == "vllm"), \
                (block, key)


def test_the_dispatchers_follow_the_written_table(tuned, monkeypatch):
    _, out, _ = tuned
    table = load_dispatch_table(out / "cpu.json")
    monkeypatch.setenv(TABLE_ENV, str(out / "cpu.json"))
    clear_table_cache()
    try:
        for tokens in (*MOE_POINTS, 2, 5, 100):
            assert select_expert_path(tokens, MoEConfig(), "cpu", torch.float32) == \
                table.path_for("moe_experts", tokens, torch.float32)
        for batch in (*DECODE_POINTS, 2, 300):
            assert select_rule_path(1, batch, "cpu", torch.float32) == table.path_for("gdn_decode", batch, torch.float32)
        assert select_rule_path(64, 1, "cpu", torch.float32) == table.path_for("gdn_prefill", 64, torch.float32)
        for tokens in (*CONV_POINTS, 2, 100):
            assert select_conv_path(tokens, "cpu", torch.float32) == table.path_for("gdn_conv", tokens, torch.float32)
        for rows in (*NORM_ROWS, 2, 100):
            assert select_gated_norm_path(rows, "cpu", torch.float32) == \
                table.path_for("gdn_gated_norm", rows, torch.float32)
            assert select_add_rms_norm_path(rows, "cpu", torch.float32) == \
                table.path_for("add_rms_norm", rows, torch.float32)
        for batch in (*DECODE_POINTS, 2, 300):
            assert select_attention_decode_layer_path(batch, "cpu", torch.float32) == \
                table.path_for("attention_layer_decode", batch, torch.float32)
    finally:
        monkeypatch.delenv(TABLE_ENV)
        clear_table_cache()


def test_the_layer_rows_run_the_conv_and_gated_norm_this_run_chose(tuned):
    _, out, report = tuned
    table = load_dispatch_table(out / "cpu.json")
    layers = [r for r in report["rows"] if r["block"].startswith("gdn_layer") and r["path"] == "layer"]
    assert layers
    for r in layers:
        tokens, rows = r["tokens"], r["batch"] * r["tokens"]
        assert r["conv"] == table.path_for("gdn_conv", tokens, torch.float32), r
        assert r["norm"] == table.path_for("gdn_gated_norm", rows, torch.float32), r
