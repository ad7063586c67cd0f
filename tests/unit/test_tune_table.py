"""The tuner's decisions from given measurements: which path a table range gets, and the targets' verdicts."""
from __future__ import annotations

import json

from harness.tune.measure.floors import Floor
from harness.tune.measure.point import Measurement
from harness.tune.measure.timing import Timing
from harness.tune.table.build import build_table, write_table
from harness.tune.table.targets import judge_targets
from model.dispatch.table import load_dispatch_table


def row(block, key, path, eager_us, graph_us=None, status="ok", floor_us=None):
    t = lambda us: None if us is None else Timing(us, us * 0.95, us * 1.05, 20)  # noqa: E731
    return Measurement(block, key, path, status, eager=t(eager_us), graph=t(graph_us),
                       floor=None if floor_us is None else Floor(floor_us, None))


def spans(table, block):
    return [(r["from"], r["to"], r["path"]) for r in table["blocks"][block]["ranges"]]


def test_graph_time_ranks_where_captured_and_eager_time_otherwise():
    rows = [row("moe_experts", 1, "tiny_bmm", 200, 40), row("moe_experts", 1, "grouped_mm", 30),  # not capturable
            row("moe_experts", 8, "tiny_bmm", 400, 100), row("moe_experts", 8, "sorted", 900, 60)]
    graph = build_table(rows, "dev", "bfloat16", prefer_graph=True, recorded={})
    assert spans(graph, "moe_experts") == [(1, 7, "grouped_mm"), (8, None, "sorted")]
    eager = build_table(rows, "dev", "bfloat16", prefer_graph=False, recorded={})
    assert spans(eager, "moe_experts") == [(1, 7, "grouped_mm"), (8, None, "tiny_bmm")]


def test_a_path_limited_to_one_token_gets_only_that_token_and_the_next_best_takes_the_rest():
    rows = [row("moe_experts", 1, "decode_fused", 10), row("moe_experts", 1, "tiny_bmm", 20),
            row("moe_experts", 1, "sorted", 30), row("moe_experts", 4, "sorted", 50)]
    table = build_table(rows, "dev", "bfloat16", prefer_graph=False, recorded={})
    assert spans(table, "moe_experts") == [(1, 1, "decode_fused"), (2, 3, "tiny_bmm"), (4, None, "sorted")]


def test_wrong_or_failed_paths_never_win_and_block_timings_decide_their_points():
    rows = [row("moe_experts", 1, "tiny_bmm", 5, status="wrong"), row("moe_experts", 1, "sorted", 50),
            row("moe_experts", 1, "grouped_mm", 40, status="error"), row("moe_experts", 1, "tiny_tokenwise", 60),
            row("moe_block", 1, "tiny_tokenwise", 70), row("moe_block", 1, "sorted", 90)]
    table = build_table(rows, "dev", "bfloat16", prefer_graph=False, recorded={})
    assert spans(table, "moe_experts") == [(1, None, "tiny_tokenwise")]


def test_gdn_blocks_are_keyed_by_tokens_and_by_batch(tmp_path):
    rows = [row("gdn_prefill", 64, "chunked", 100), row("gdn_prefill", 64, "fla_chunk", 50),
            row("gdn_decode", 1, "decode_step", 30), row("gdn_decode", 1, "fla_recurrent", 10),
            row("gdn_decode", 64, "decode_step", 20), row("gdn_decode", 64, "fla_recurrent", 25)]
    table = build_table(rows, "NVIDIA H200", "bfloat16", prefer_graph=False, recorded={"date": "d"})
    assert spans(table, "gdn_prefill") == [(1, None, "fla_chunk")]
    assert spans(table, "gdn_decode") == [(1, 63, "fla_recurrent"), (64, None, "decode_step")]
    assert table["blocks"]["gdn_decode"]["keyed_by"] == "batch"
    path = write_table(table, tmp_path / "nvidia-h200.json")
    assert load_dispatch_table(path).path_for("gdn_decode", 100, None) == "decode_step"


def test_rewriting_one_side_keeps_the_other_sides_blocks(tmp_path):
    path = tmp_path / "t.json"
    write_table(build_table([row("moe_experts", 1, "sorted", 5)], "d", "bfloat16", False, {}), path)
    write_table(build_table([row("gdn_decode", 1, "decode_step", 5)], "d", "bfloat16", False, {}), path)
    assert set(json.loads(path.read_text())["blocks"]) == {"moe_experts", "gdn_decode"}


def test_targets_say_met_or_missed_by_how_much():
    rows = [row("gdn_decode", 1, "fla_recurrent", 60, 15), row("gdn_decode", 256, "fla_recurrent", 200, 150),
            row("moe_experts", 2, "triton_decode", 100, 30, floor_us=10)]
    lines = {v.target: v.line() for v in judge_targets(rows)}
    assert lines["GDN decode B=1, graph"].endswith("15.0 us by fla_recurrent: met")
    assert "MISSED by 30.0 us (1.25x)" in lines["GDN decode B=256, graph"]
    assert "MISSED by 10.0 us (1.50x)" in lines["MoE experts T=2, graph, 2x floor"]
    assert lines["MoE experts T=1, graph"].endswith("not measured"), "its block ran, that point did not"
    assert "GDN prefill T=16384, graph" not in lines, "a block this run did not measure is not judged"


def test_whole_block_paths_rank_beside_the_composed_block_and_stay_out_of_the_expert_ranges():
    # moe_block rows named by an expert path are the composed block with it; the fused block takes <= 64 tokens.
    rows = [row("moe_experts", 1, "tiny_bmm", 50), row("moe_experts", 1, "triton_decode", 40),
            row("moe_block", 1, "triton_decode", 400), row("moe_block", 1, "tiny_bmm", 450),
            row("moe_block", 1, "triton_fused_block", 100),
            row("moe_block", 4096, "sorted", 900)]
    table = build_table(rows, "dev", "bfloat16", prefer_graph=False, recorded={})
    assert spans(table, "moe_block") == [(1, 64, "triton_fused_block"), (65, None, "composed")]
    experts = spans(table, "moe_experts")
    assert experts[0] == (1, 256, "triton_decode")  # ranked by the composed block's time; the fused row is no expert
    assert "triton_fused_block" not in {path for _, _, path in experts}


def test_the_gdn_decode_layer_ranks_whole_layers_only():
    rows = [row("gdn_layer_decode", 1, "layer", 600), row("gdn_layer_decode", 1, "triton", 90),
            row("gdn_layer_decode", 1, "out_proj", 20),  # one stage of the staged layer: never a choice
            row("gdn_layer_decode", 256, "layer", 300), row("gdn_layer_decode", 256, "triton", 400)]
    table = build_table(rows, "dev", "bfloat16", prefer_graph=False, recorded={})
    assert spans(table, "gdn_layer_decode") == [(1, 255, "triton"), (256, None, "staged")]
    assert table["blocks"]["gdn_layer_decode"]["keyed_by"] == "batch"
    verdicts = {v.target: v for v in judge_targets(rows)}
    eager = verdicts["GDN decode layer B=1, eager"]
    assert (eager.measured_us, eager.path, eager.met) == (90, "triton", True)  # not the 20 us stage


def test_the_conv_ranges_give_update_its_one_token_and_the_gated_norm_is_keyed_by_rows(tmp_path):
    rows = [row("gdn_conv", 1, "update", 30, 8), row("gdn_conv", 1, "triton", 40, 5),
            row("gdn_conv", 1, "prefill", 90, 20), row("gdn_conv", 64, "prefill", 100, 30),
            row("gdn_conv", 64, "triton", 50, 6), row("gdn_conv", 4096, "triton", 80, 40),
            row("gdn_conv", 4096, "prefill", 900, 800, status="wrong"),
            row("gdn_gated_norm", 1, "fused", 40, 10), row("gdn_gated_norm", 1, "triton", 20, 4),
            row("gdn_gated_norm", 16384, "fused", 300, 290), row("gdn_gated_norm", 16384, "triton", 350, 200)]
    eager = build_table(rows, "dev", "bfloat16", prefer_graph=False, recorded={})
    # update wins T=1 eagerly but takes one token: the next best measured there takes T=2..63.
    assert spans(eager, "gdn_conv") == [(1, 1, "update"), (2, None, "triton")]
    assert spans(eager, "gdn_gated_norm") == [(1, 16383, "triton"), (16384, None, "fused")]
    graph = build_table(rows, "dev", "bfloat16", prefer_graph=True, recorded={})
    assert spans(graph, "gdn_conv") == [(1, None, "triton")]
    assert spans(graph, "gdn_gated_norm") == [(1, None, "triton")]
    assert graph["blocks"]["gdn_gated_norm"]["keyed_by"] == "tokens"
    table = load_dispatch_table(write_table(graph, tmp_path / "t.json"))
    assert table.path_for("gdn_conv", 7, None) == "triton" and table.path_for("gdn_gated_norm", 8, None) == "triton"



def test_vllms_own_layer_never_takes_a_range_and_its_faster_spans_are_recorded_beside_them(tmp_path):
    """The ranges are the model's (its own dispatchers serve them); where vLLM's own layer ranked first, the span up to
    the next measured point is listed under `vllm_faster`, adjacent spans merged; a wrong vLLM row never counts."""
    rows = [row("add_rms_norm", 1, "fused", 30), row("add_rms_norm", 1, "vllm", 20),
            row("add_rms_norm", 8, "fused", 30), row("add_rms_norm", 8, "vllm", 25),
            row("add_rms_norm", 64, "fused", 40), row("add_rms_norm", 64, "vllm", 60),
            row("add_rms_norm", 512, "fused", 90), row("add_rms_norm", 512, "vllm", 10, status="wrong"),
            row("moe_block", 1, "tiny_bmm", 100), row("moe_block", 1, "vllm", 50)]
    table = build_table(rows, "dev", "bfloat16", prefer_graph=False, recorded={})
    assert spans(table, "add_rms_norm") == [(1, None, "fused")]
    faster = table["blocks"]["add_rms_norm"]["vllm_faster"]
    assert [(r["from"], r["to"]) for r in faster] == [(1, 63)]
    assert [m["at"] for m in faster[0]["measured"]] == [1, 8]
    assert faster[0]["measured"][0]["model"] == {"path": "fused", "us": 30}
    assert spans(table, "moe_experts") == [(1, None, "tiny_bmm")]  # vLLM's block is no expert path
    assert [(r["from"], r["to"]) for r in table["blocks"]["moe_block"]["vllm_faster"]] == [(1, None)]
    loaded = load_dispatch_table(write_table(table, tmp_path / "dev.json"))
    assert loaded.path_for("add_rms_norm", 8, None) == "fused"
    assert loaded.vllm_faster_at("add_rms_norm", 63, None) and not loaded.vllm_faster_at("add_rms_norm", 64, None)
    # the ratios the plugin's status row gives: the range's path over vLLM's own (median of its points: 30/20,
    # 30/25, 40/60, and 512 where vLLM's row was wrong, so not timed), and a faster span's vLLM over the model's
    [whole] = loaded.blocks["add_rms_norm"]
    assert whole.time_ratio == 30 / 25
    [span] = loaded.vllm_faster["add_rms_norm"]
    assert span.time_ratio == 25 / 30
