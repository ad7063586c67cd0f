"""The full check (`qwen36 tune --check-stale`) on a table recorded before the staged GDN layer's conv and gated
norm, the attention decode layer and the residual add + RMSNorm were dispatched (`gdn_conv`, `gdn_gated_norm`,
`attention_layer_decode`, `add_rms_norm`): such a table serves `update` / `prefill`, `fused`, `staged` and `fused`,
so the full check times every path of those blocks at the table's GDN points and calls it stale where another
path beats that default in every sweep. The routine check times none of them."""
from __future__ import annotations

from harness.tune.check.plan import plan_check
from harness.tune.check.run import _judge_stale
from harness.tune.measure.point import Measurement


def swept(block, key, path, *eager_us):
    return Measurement(block, key, path, "ok", extra={"eager_sweeps_us": list(eager_us)})


def _gdn(block, key, path):
    return {"keyed_by": "batch" if block == "gdn_decode" else "tokens",
            "ranges": [{"from": 1, "to": None, "path": path, "measured": [{"at": key}]}]}


OLD_TABLE = {"ranked_by": "eager", "blocks": {"gdn_prefill": _gdn("gdn_prefill", 64, "chunked"),
                                              "gdn_decode": _gdn("gdn_decode", 8, "decode_step")}}


def judge(rows, table=OLD_TABLE):
    plan = plan_check(table, {}, full=True)
    verdicts, failures = [], []
    _judge_stale(plan, rows, table, verdicts, failures)
    return plan, {(v.block, v.key): v for v in verdicts}, failures


def test_the_full_check_times_every_stage_path_at_the_tables_gdn_points():
    plan, _, _ = judge([])
    assert plan.gdn_conv == {1: None, 64: None}  # one token and the prefill point
    assert plan.gdn_gated_norm == {8: None, 64: None}  # the decode batch and the prefill point, as rows
    assert plan.attention_layer_decode == {8: None}  # the decode batch
    assert plan.add_rms_norm == {8: None, 64: None}  # as the gated norm's rows
    assert plan.by_default == {("gdn_conv", 1): "update", ("gdn_conv", 64): "prefill",
                               ("gdn_gated_norm", 8): "fused", ("gdn_gated_norm", 64): "fused",
                               ("attention_layer_decode", 8): "staged",
                               ("add_rms_norm", 8): "fused", ("add_rms_norm", 64): "fused"}
    routine = plan_check(OLD_TABLE, {}, full=False)
    assert not (routine.gdn_conv or routine.gdn_gated_norm or routine.attention_layer_decode or routine.add_rms_norm
                or routine.by_default)


def test_an_old_table_is_stale_where_a_stage_path_beats_its_default_every_sweep():
    rows = [swept("gdn_conv", 64, "prefill", 900, 910, 905), swept("gdn_conv", 64, "triton", 40, 41, 42),
            swept("gdn_conv", 1, "update", 30, 31, 30), swept("gdn_conv", 1, "triton", 29, 40, 28),  # not every sweep
            swept("gdn_gated_norm", 64, "fused", 50, 52, 51), swept("gdn_gated_norm", 64, "triton", 20, 21, 20),
            swept("gdn_gated_norm", 8, "fused", 50, 52, 51)]
    _, verdicts, failures = judge(rows)
    conv = verdicts[("gdn_conv", 64)]
    assert conv.stale and (conv.chosen, conv.best) == ("prefill", "triton")
    assert not verdicts[("gdn_conv", 1)].stale and verdicts[("gdn_conv", 1)].chosen == "update"
    assert verdicts[("gdn_gated_norm", 64)].stale and not verdicts[("gdn_gated_norm", 8)].stale
    assert len(failures) == 2 and all(f.startswith("STALE: gdn_") for f in failures)


def test_a_table_with_the_stage_blocks_is_judged_on_its_own_choices():
    table = {**OLD_TABLE, "blocks": {**OLD_TABLE["blocks"], "gdn_conv": _gdn("gdn_conv", 64, "triton")}}
    rows = [swept("gdn_conv", 64, "prefill", 900, 910, 905), swept("gdn_conv", 64, "triton", 40, 41, 42)]
    plan, verdicts, failures = judge(rows, table)
    assert ("gdn_conv", 1) not in plan.by_default and plan.dispatched[("gdn_conv", 64)] == "triton"
    assert not verdicts[("gdn_conv", 64)].stale and verdicts[("gdn_conv", 64)].chosen == "triton"
    assert failures == []


def test_an_old_table_is_stale_where_the_attention_or_the_add_norm_path_beats_its_default_every_sweep():
    rows = [swept("attention_layer_decode", 8, "staged", 1600, 1650, 1620),
            swept("attention_layer_decode", 8, "triton", 60, 62, 61),
            swept("add_rms_norm", 8, "fused", 150, 151, 149), swept("add_rms_norm", 8, "triton", 140, 160, 30),
            swept("add_rms_norm", 64, "fused", 150, 151, 149)]
    _, verdicts, failures = judge(rows)
    attention = verdicts[("attention_layer_decode", 8)]
    assert attention.stale and (attention.chosen, attention.best) == ("staged", "triton")
    assert not verdicts[("add_rms_norm", 8)].stale, "triton lost one sweep"
    assert len(failures) == 1 and failures[0].startswith("STALE: attention_layer_decode")
