"""The full check (`qwen36 tune --check-stale`) on a table recorded before `moe_block` and `gdn_layer_decode`
were dispatched: such a table serves the composed block and the staged layer there, and is stale where a fused
path measured beside them is faster in every sweep. The routed experts' own choice is judged on the composed
block's rows only, never against a fused block."""
from __future__ import annotations

from harness.tune.check.plan import plan_check
from harness.tune.check.run import _judge_stale
from harness.tune.measure.point import Measurement


def swept(block, key, path, *eager_us):
    return Measurement(block, key, path, "ok", extra={"eager_sweeps_us": list(eager_us)})


OLD_TABLE = {  # moe_experts chosen at T=1 by the block's time; no whole-block entries
    "ranked_by": "eager",
    "blocks": {
        "moe_experts": {"keyed_by": "tokens", "ranges": [
            {"from": 1, "to": None, "path": "triton_decode", "measured": [{"at": 1, "timed_in": "moe_block"}]}]},
        "gdn_decode": {"keyed_by": "batch", "ranges": [
            {"from": 1, "to": None, "path": "fla_recurrent", "measured": [{"at": 1}]}]},
    },
}
RECORDED = {("moe_block", 1, "triton_decode"): None, ("gdn_layer_decode", 1, "layer"): None}


def judge(rows, table=OLD_TABLE):
    plan = plan_check(table, RECORDED, full=True)
    verdicts, failures = [], []
    _judge_stale(plan, rows, table, verdicts, failures)
    return {(v.block, v.key): v for v in verdicts}, failures


def test_an_old_table_is_stale_where_a_fused_path_wins_every_sweep():
    rows = [swept("moe_block", 1, "triton_decode", 500, 510, 505), swept("moe_block", 1, "tiny_bmm", 700, 690, 720),
            swept("moe_block", 1, "triton_fused_block", 120, 125, 118),
            swept("gdn_layer_decode", 1, "layer", 640, 650, 660), swept("gdn_layer_decode", 1, "triton", 95, 99, 97),
            swept("gdn_layer_decode", 1, "conv", 100, 100, 100)]  # a stage: stands for no choice
    verdicts, failures = judge(rows)
    block, layer = verdicts[("moe_block", 1)], verdicts[("gdn_layer_decode", 1)]
    assert block.stale and (block.chosen, block.best) == ("composed", "triton_fused_block")
    assert layer.stale and (layer.chosen, layer.best) == ("staged", "triton")
    assert not verdicts[("moe_experts", 1)].stale  # triton_decode is still the fastest expert path in the block
    assert verdicts[("moe_experts", 1)].best == "triton_decode"
    assert len(failures) == 2 and all(f.startswith("STALE: ") for f in failures)


def test_a_fused_path_that_does_not_win_every_sweep_leaves_the_table_fresh():
    rows = [swept("moe_block", 1, "triton_decode", 500, 510, 505),
            swept("moe_block", 1, "triton_fused_block", 120, 560, 118),  # slower in one sweep
            swept("gdn_layer_decode", 1, "layer", 640, 650, 660), swept("gdn_layer_decode", 1, "triton", 700, 99, 97)]
    verdicts, failures = judge(rows)
    assert not verdicts[("moe_block", 1)].stale and not verdicts[("gdn_layer_decode", 1)].stale
    assert failures == []


def test_a_table_that_serves_the_fused_paths_is_judged_on_them():
    table = {**OLD_TABLE, "blocks": {**OLD_TABLE["blocks"],
        "moe_block": {"keyed_by": "tokens", "ranges": [
            {"from": 1, "to": 64, "path": "triton_fused_block", "measured": [{"at": 1}]},
            {"from": 65, "to": None, "path": "composed"}]},
        "gdn_layer_decode": {"keyed_by": "batch", "ranges": [
            {"from": 1, "to": None, "path": "triton", "measured": [{"at": 1}]}]}}}
    rows = [swept("moe_block", 1, "triton_decode", 100, 101, 99),  # composed now beats the fused block
            swept("moe_block", 1, "triton_fused_block", 300, 310, 305),
            swept("gdn_layer_decode", 1, "layer", 640, 650, 660), swept("gdn_layer_decode", 1, "triton", 95, 99, 97)]
    verdicts, failures = judge(rows, table)
    block = verdicts[("moe_block", 1)]
    assert block.stale and (block.chosen, block.best) == ("triton_fused_block", "composed")
    assert not verdicts[("gdn_layer_decode", 1)].stale
    assert len(failures) == 1
