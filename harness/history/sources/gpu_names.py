"""How the tuner's points become metric names, and which of a dispatch table's points its GPU gate judges.

One name per (block, key, path, mode) for a check, a `qwen36 tune` run and a committed table alike:
`gpu.<block>.<path>.<t|b><key>.<mode>_us`, `t` for the blocks keyed by tokens and `b` for those keyed by batch
(harness/tune/check/rule.py's BATCH_KEYED, as its point names say `T=` or `B=`).

The tables' constants are copied here, not imported: harness/tune/table/record.py and harness/tune/check/plan.py
import torch (through the measuring code and model/), and a history is made where torch is not installed.
tests/unit/test_history_sources.py checks the copies against those files' text.
"""
from __future__ import annotations

from harness.history.sources.common import metric
from harness.tune.check.rule import BATCH_KEYED

__all__ = ["RECORDED_BLOCKS", "LAYER_ROWS", "PATH_BLOCKS", "point_metric", "gpu_detail", "recordable_row",
           "gated_mode", "gated_points"]

# harness/tune/table/record.py RECORDED_BLOCKS: what a table's timings hold.
RECORDED_BLOCKS = ("moe_experts", "moe_block", "gdn_prefill", "gdn_decode", "gdn_layer_decode", "gdn_layer_prefill",
                   "gdn_conv", "gdn_gated_norm", "attention_layer_decode", "add_rms_norm", "decode_step")
# A whole GDN layer's rows (harness/tune/table/block_rows.py is_layer_row): the staged layer's `layer` and the fused
# decode-layer paths (model/gdn/decode_layer.py GDN_DECODE_LAYER_PATHS but `reference` and `staged`); the rows of
# the layer's stages (in_proj, conv, ...) are reported, not recorded.
LAYER_ROWS = ("layer", "triton")
# harness/tune/check/plan.py PATH_BLOCKS: the blocks a check times at the table's path at each dispatch point.
PATH_BLOCKS = ("moe_experts", "gdn_prefill", "gdn_decode", "gdn_conv", "gdn_gated_norm", "attention_layer_decode",
               "add_rms_norm")
COMPOSED = "composed"  # harness/tune/table/block_rows.py: the MoE block composed of the router and the experts


def point_metric(block: str, key, path: str, mode: str) -> str:
    return metric("gpu", block, path, f"{'b' if block in BATCH_KEYED else 't'}{int(key)}", f"{mode}_us")


def gpu_detail(gpu_uuid: str | None, torch: str | None) -> str:
    return ", ".join(x for x in (gpu_uuid and f"gpu_uuid {gpu_uuid}", torch and f"torch {torch}") if x)


def recordable_row(block: str, path: str) -> bool:
    """A `qwen36 tune` row its table would record as a point (harness/tune/table/record.py _recordable)."""
    return block in RECORDED_BLOCKS and (not block.startswith("gdn_layer") or path in LAYER_ROWS)


def gated_mode(table: dict, has_graph: bool) -> str:
    """The mode a check gates (harness/tune/check/run.py _judge): graph replay where the table ranks by it and
    holds graph times, else eager (the other mode is reported, not gated)."""
    return "graph" if has_graph and str(table.get("ranked_by", "")).startswith("graph") else "eager"


def _served(spec: dict | None, key: int) -> str | None:
    for r in (spec or {}).get("ranges", []):
        if r["from"] <= key and (r["to"] is None or key <= r["to"]):
            return r["path"]
    return None


def gated_points(table: dict, recorded: set[tuple[str, int, str]]) -> set[tuple[str, int, str]]:
    """The (block, key, path) of `recorded` that a routine check against `table` times and judges
    (harness/tune/check/plan.py routine_plan): the table's path at each point its ranges were chosen at; the
    staged GDN layer and the fused layer paths the table serves, at the layer's points; the MoE block as served
    (a fused block path, or the composed block's row of the experts served there); the whole decode step."""
    blocks = table.get("blocks") or {}
    dispatched: dict[tuple[str, int], str] = {}
    for block, spec in blocks.items():
        for r in spec.get("ranges", []):
            for evidence in r.get("measured", []):
                at = evidence.get("at")
                if at is not None and r["from"] <= at and (r["to"] is None or at <= r["to"]):
                    dispatched[(block, int(at))] = r["path"]
    gated = {(b, k, p) for (b, k), p in dispatched.items() if b in PATH_BLOCKS}
    fused_layers = {p for (b, _), p in dispatched.items() if b == "gdn_layer_decode"} & set(LAYER_ROWS)
    for block, key, path in recorded:
        if block in ("gdn_layer_decode", "gdn_layer_prefill"):
            if path == "layer" or (block == "gdn_layer_decode" and path in fused_layers):
                gated.add((block, key, path))
        elif block == "moe_block":
            served = _served(blocks.get("moe_block"), key) or COMPOSED
            row = _served(blocks.get("moe_experts"), key) if served == COMPOSED else served
            if path == row:
                gated.add((block, key, path))
        elif block == "decode_step":
            gated.add((block, key, path))
    return gated & recorded
