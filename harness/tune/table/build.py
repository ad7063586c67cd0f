"""From measurements to the device's dispatch table (format: model.dispatch.table).

At each measured point the paths whose outputs met the bound are ranked by their graph replay time where the
platform has graphs and the path captured (`prefer_graph`), else by their eager time. A point's choice holds
from that point up to the next measured one (the first range starts at 1, the last is open); where the
fastest path takes fewer tokens than that span (decode_fused serves T == 1 only), the rest of the span goes
to the next fastest path that takes it. For the routed experts, the points where the whole block was timed
rank by the block's time: what is fastest end to end is what serves. The whole MoE block's path and the GDN
decode layer's path are ranked from their rows too (harness/tune/table/block_rows.py). Adjacent ranges with one
path merge.
"""
from __future__ import annotations

import json
from pathlib import Path

from model.dispatch.table import BLOCKS, SCHEMA, load_dispatch_table
from model.gdn import CONV_PATHS, GDN_RULE_PATHS
from model.moe import EXPERT_PATHS, MOE_BLOCK_PATHS
from model.norm.rms_norm import GATED_NORM_PATHS

from ..measure.point import Measurement
from .block_rows import VLLM, block_choice
from .record import keep_blocks

__all__ = ["ranked", "winners", "build_table", "write_table", "table_serving"]


def ranked(rows: list[Measurement], block: str, prefer_graph: bool, row_block: str | None = None,
           with_vllm: bool = False) -> dict[int, list[dict]]:
    """point -> the correct choices of dispatch block `block` measured there, fastest first:
    [{"path", "us", "mode"}, ...], from the rows of `row_block` (default: the block itself), each named by the
    choice it stands for (harness/tune/table/block_rows.py); vLLM's own layer among them only `with_vllm`."""
    out: dict[int, list[tuple[float, str, str]]] = {}
    for r in rows:
        if r.block != (row_block or block):
            continue
        choice = block_choice(block, r.block, r.path)
        if choice == VLLM and not with_vllm:
            continue
        best = r.best(prefer_graph) if choice else None
        if best:
            out.setdefault(r.key, []).append((best[0], choice, best[1]))
    return {k: [{"path": p, "us": round(us, 2), "mode": mode} for us, p, mode in sorted(v)] for k, v in out.items()}


def winners(rows: list[Measurement], block: str, prefer_graph: bool) -> dict[int, dict]:
    """point -> the fastest correct path measured there."""
    return {k: v[0] for k, v in ranked(rows, block, prefer_graph).items()}


def _token_limit(block: str, path: str) -> int | None:
    """The most tokens (per call) a path takes; the decode blocks count sequences, which no path limits."""
    registry = {"moe_experts": EXPERT_PATHS, "moe_block": MOE_BLOCK_PATHS, "gdn_prefill": GDN_RULE_PATHS,
                "gdn_conv": CONV_PATHS, "gdn_gated_norm": GATED_NORM_PATHS}.get(block)
    return registry[path].max_tokens if registry and path in registry else None


def _covering(block: str, low: int, high: int | None, candidates: list[dict], timed_in: str) -> list[dict]:
    """Ranges over [low, high] from the candidates in rank order, each taking as much as its token limit allows."""
    out = []
    for c in candidates:
        limit = _token_limit(block, c["path"])
        if limit is not None and limit < low:
            continue
        top = high if limit is None or (high is not None and limit >= high) else limit
        evidence = {"us": c["us"], "mode": c["mode"], "timed_in": timed_in}
        out.append({"from": low, "to": top, "path": c["path"], "measured": [evidence]})
        if top is None or (high is not None and top >= high):
            break
        low = top + 1
    return out


def _ranges(block: str, points: dict[int, tuple[list[dict], str]]) -> list[dict]:
    keys = sorted(points)
    ranges: list[dict] = []
    for i, key in enumerate(keys):
        candidates, timed_in = points[key]
        high = keys[i + 1] - 1 if i + 1 < len(keys) else None
        for r in _covering(block, 1 if i == 0 else key, high, candidates, timed_in):
            r["measured"][0]["at"] = key
            if ranges and ranges[-1]["path"] == r["path"] and ranges[-1]["to"] == r["from"] - 1:
                ranges[-1]["to"] = r["to"]
                ranges[-1]["measured"] += r["measured"]
            else:
                ranges.append(r)
    return ranges


def _add_vllm_times(ranges: list[dict], points: dict[int, list[dict]]) -> None:
    """Beside each range's evidence, vLLM's own layer's time at that point where it was timed (`vllm_us`), and the
    path's time over it (`time_ratio`), which the plugin's status row gives."""
    for r in ranges:
        for evidence in r["measured"]:
            own = next((c["us"] for c in points.get(evidence.get("at"), []) if c["path"] == VLLM), None)
            if own is not None:
                evidence.update(vllm_us=own, time_ratio=evidence["us"] / own)


def _vllm_faster(points: dict[int, list[dict]]) -> list[dict]:
    """The spans where vLLM's own layer ranked first: from each such measured point up to the next measured point
    (the rule the ranges follow), adjacent spans merged, each with the two times that decided it."""
    keys = sorted(points)
    out: list[dict] = []
    for i, key in enumerate(keys):
        ranking = points[key]
        if ranking[0]["path"] != VLLM:
            continue
        model = next((c for c in ranking if c["path"] != VLLM), None)
        low, high = (1 if i == 0 else key), (keys[i + 1] - 1 if i + 1 < len(keys) else None)
        evidence = {"at": key, "vllm_us": ranking[0]["us"], "mode": ranking[0]["mode"],
                    "model": None if model is None else {"path": model["path"], "us": model["us"]}}
        if model is not None:
            evidence["time_ratio"] = ranking[0]["us"] / model["us"]
        if out and out[-1]["to"] == low - 1:
            out[-1]["to"] = high
            out[-1]["measured"].append(evidence)
        else:
            out.append({"from": low, "to": high, "measured": [evidence]})
    return out


def build_table(rows: list[Measurement], device: str, dtype: str, prefer_graph: bool, recorded: dict,
                timings: dict | None = None) -> dict:
    """The table from (sweep-merged) rows; `timings` (harness/tune/table/record.py) is stored beside the ranges."""
    blocks = {}
    for block in BLOCKS:
        points = {k: (v, block) for k, v in ranked(rows, block, prefer_graph).items()}
        if block == "moe_experts":  # where the whole block was timed, its time ranks the experts
            points.update({k: (v, "moe_block") for k, v in ranked(rows, block, prefer_graph, "moe_block").items()})
        if points:
            with_vllm = ranked(rows, block, prefer_graph, with_vllm=True)
            ranges = _ranges(block, points)
            _add_vllm_times(ranges, with_vllm)
            blocks[block] = {"keyed_by": BLOCKS[block], "recorded": recorded.get("date"), "ranges": ranges}
            faster = _vllm_faster(with_vllm)
            if faster:
                blocks[block]["vllm_faster"] = faster
    table = {"schema": SCHEMA, "device": device, "dtype": dtype,
             "ranked_by": "graph replay where captured, else eager" if prefer_graph else "eager",
             "recorded": recorded, "blocks": blocks}
    if timings is not None:
        table["timings"] = timings
    return table


def write_table(table: dict, path: Path) -> Path:
    """Write the table; blocks (and their timings) this run did not measure are kept from an existing table of
    the same dtype (`qwen36 tune gdn` must not erase the MoE entries)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        old = load_dispatch_table(path)  # refuses a broken file rather than overwriting it blindly
        if old.dtype == table["dtype"]:
            raw = json.loads(path.read_text())
            kept = {b: r for b, r in raw["blocks"].items() if b not in table["blocks"]}
            table = dict(table, blocks={**kept, **table["blocks"]})
            if "timings" in table:
                measured = {p["block"] for p in table["timings"]["points"]}
                table["timings"] = keep_blocks(raw.get("timings"), table["timings"], measured)
    path.write_text(json.dumps(table, indent=2) + "\n")
    load_dispatch_table(path)  # what the dispatchers will read must load
    return path


def table_serving(paths: dict[str, str], device: str, dtype: str) -> dict:
    """A table that serves `paths` (block -> path) at every key, measured nowhere: for a tool or test that runs
    the model on chosen paths through the dispatchers, as serving would (not for a device's table directory)."""
    blocks = {block: {"keyed_by": BLOCKS[block], "recorded": None,
                      "ranges": [{"from": 1, "to": None, "path": path, "measured": []}]}
              for block, path in paths.items()}
    return {"schema": SCHEMA, "device": device, "dtype": dtype, "ranked_by": "eager",
            "recorded": {"note": "not measured: a table written to serve chosen paths"}, "blocks": blocks}
