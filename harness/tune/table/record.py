"""The dispatch table's `timings`: every correct path's eager and graph time at every point, sweep by sweep and
run by run, so a gate can say both whether a point got slower and how far its time moves on its own.

    "timings": {
      "method": "...how each value was measured...",
      "runs": [{"id": 0, "date": "2026-12-04", "host": "...", "command": "qwen36 tune ...", "sweeps": 3,
                "call_costs": {"aten_op_host_us": 6.2, "timer_us": 5.9}}, ...],
      "points": [{"block": "moe_experts", "key": 1, "path": "triton_decode",
                  "runs": [{"run": 0, "eager_us": [75.1, 74.0, 76.2], "graph_us": [14.7, 14.6, 14.9],
                            "gpu_us": [8.1, 8.1, 8.2], "host_us": [52.0, 51.1, 50.7],
                            "launches": {"eager": {"kernels": 2, "memcpy": 0, "memset": 0}, "graph": {...}}}],
                  "tolerance": {"eager": 0.12, "graph": 0.14, "gpu": 0.03}}, ...]}

A value is one sweep's median of `reps` samples: `eager` as an eager caller pays it, `graph` a replay as a
caller times it (its launch included), `gpu` the GPU's own time with the launch hidden, `host` the host's
microseconds per call. `launches` are one call's and one replay's, counted once per run. `tolerance` is what
the gate's rule gives each mode from the values recorded so far, written by the commands that record a run
(harness/tune/check/rule.py `with_tolerances`) for the reader; the gate recomputes it. `qwen36 tune` writes run 0 (a re-record starts again);
`qwen36 tune --check --add-run` appends a passing check's values as another run, so the spread a tolerance is
sized from comes from separate processes, days and machines, not from one. The GDN layer's rows are recorded as
path `layer` with the rule path the table gave it (`rule`); the layer's stages are reported, not recorded.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass, field

from ..measure.point import Measurement
from .block_rows import is_layer_row

__all__ = ["RecordedPoint", "RECORDED_BLOCKS", "new_timings", "append_run", "recorded_points", "keep_blocks",
           "run_meta"]

# What the timings hold: the dispatch blocks, the whole MoE block, the GDN layer end to end, and the whole decode
# step (harness/tune/step/point.py).
RECORDED_BLOCKS = ("moe_experts", "moe_block", "gdn_prefill", "gdn_decode", "gdn_layer_decode", "gdn_layer_prefill",
                   "gdn_conv", "gdn_gated_norm", "attention_layer_decode", "add_rms_norm", "decode_step")


@dataclass
class RecordedPoint:
    block: str
    key: int
    path: str
    eager_runs: list[list[float]] = field(default_factory=list)  # per run, each sweep's median
    graph_runs: list[list[float]] = field(default_factory=list)
    rule: str | None = None  # the GDN layer's rule path when recorded
    gpu_runs: list[list[float]] = field(default_factory=list)
    host_runs: list[list[float]] = field(default_factory=list)
    launches: dict[str, dict[str, int]] = field(default_factory=dict)  # mode -> counts, of the latest run counting

    def values(self, mode: str) -> list[float]:
        return [v for run in getattr(self, f"{mode}_runs") for v in run]


def run_meta(run_id: int, date: str, command: str, sweeps: int, **more) -> dict:
    """A run's entry; `more` adds the machine, the versions, and `call_costs` (harness/tune/measure/call_costs.py)."""
    return {"id": run_id, "date": date, "host": socket.gethostname(), "command": command, "sweeps": sweeps, **more}


def _recordable(r: Measurement) -> bool:
    if r.status != "ok" or r.block not in RECORDED_BLOCKS:
        return False
    return is_layer_row(r.block, r.path) if r.block.startswith("gdn_layer") else True


def _entry(r: Measurement, run_id: int) -> dict:
    entry = {"run": run_id, **{f"{mode}_us": list(r.extra.get(f"{mode}_sweeps_us", []))
                               for mode in ("eager", "graph", "gpu", "host")}}
    launches = {mode: counts for mode, counts in (("eager", r.launches), ("graph", r.graph_launches)) if counts}
    return {**entry, "launches": launches} if launches else entry


def new_timings(rows: list[Measurement], method: str, meta: dict) -> dict:
    """Timings holding one run (`meta`, id 0) of the merged rows."""
    return append_run({"method": method, "runs": [], "points": []}, rows, meta)


def append_run(timings: dict, rows: list[Measurement], meta: dict) -> dict:
    """A copy of `timings` with `rows` added as run `meta["id"]` (points not seen before are added)."""
    points = {(p["block"], p["key"], p["path"]): dict(p, runs=list(p["runs"])) for p in timings.get("points", [])}
    for r in rows:
        if not _recordable(r):
            continue
        point = points.setdefault((r.block, r.key, r.path), {"block": r.block, "key": r.key, "path": r.path,
                                                              "runs": []})
        if r.extra.get("rule") and is_layer_row(r.block, r.path):
            point["rule"] = r.extra["rule"]
        point["runs"].append(_entry(r, meta["id"]))
    return {"method": timings.get("method", ""), "runs": [*timings.get("runs", []), meta],
            "points": list(points.values())}


def keep_blocks(old: dict | None, new: dict, measured_blocks: set[str]) -> dict:
    """`new`, plus the points (and their runs) of `old` for blocks this run did not measure: `qwen36 tune gdn`
    must not erase the MoE record. Old runs keep their ids; the new run's id follows them."""
    if not old:
        return new
    kept = [p for p in old.get("points", []) if p["block"] not in measured_blocks]
    if not kept:
        return new
    offset = 1 + max((r["id"] for r in old.get("runs", [])), default=-1)
    runs = [r for r in old.get("runs", []) if any(e["run"] == r["id"] for p in kept for e in p["runs"])]
    shifted = [{**r, "id": r["id"] + offset} for r in new["runs"]]
    points = [{**p, "runs": [{**e, "run": e["run"] + offset} for e in p["runs"]]} for p in new["points"]]
    return {"method": new["method"], "runs": runs + shifted, "points": kept + points}


def recorded_points(timings: dict | None) -> dict[tuple[str, int, str], RecordedPoint]:
    """(block, key, path) -> what was recorded there; empty for a table without timings (schema 1)."""
    out = {}
    for p in (timings or {}).get("points", []):
        rp = RecordedPoint(p["block"], int(p["key"]), p["path"], rule=p.get("rule"))
        for e in p["runs"]:
            for mode in ("eager", "graph", "gpu", "host"):
                if e.get(f"{mode}_us"):
                    getattr(rp, f"{mode}_runs").append([float(v) for v in e[f"{mode}_us"]])
            rp.launches.update(e.get("launches") or {})  # runs in order: the latest count of each mode stands
        out[(rp.block, rp.key, rp.path)] = rp
    return out
