"""`qwen36 tune` (tune.json, harness/tune/table/report.py) and a dispatch table's recorded timings
(fixtures/dispatch/<device>.json, schema qwen36-dispatch/2, harness/tune/table/record.py).

The figures are the points a table records (every correct path at every point of a recorded block, eager and
graph), named as a check names them, so `qwen36 tune`, the table's runs and `--check` draw one line per point
and path. The points a routine check judges, in the mode it gates, are marked gated (gpu_names.gated_points);
the rest are drawn, not flagged. A figure's threshold is the tolerance a check against that table allows at
the point: the slowest recorded value plus the mode's floor, against the median (harness/tune/check/rule.py).

A table holds one run per `qwen36 tune` and per `--check --add-run`, each its own process, day and machine:
one record per run, dated and placed by the run.
"""
from __future__ import annotations

import statistics

from harness.history.machines import device_machine
from harness.history.record import Figure, Record
from harness.history.sources.common import Given, NoFigures, build_record, min_max, relative, run_date
from harness.history.sources.gpu_names import (
    RECORDED_BLOCKS, gated_mode, gated_points, gpu_detail, point_metric, recordable_row,
)
from harness.tune.check.rule import tolerance

__all__ = ["FILES", "WRITER", "TABLE_WRITER", "KIND", "TABLE_KIND", "claims_tune", "claims_table",
           "from_tune_payload", "from_table_payload"]

FILES = ("tune.json",)
WRITER = "`qwen36 tune` (harness/tune/table/report.py)"
TABLE_WRITER = "`qwen36 tune` and `qwen36 tune --check --add-run` (fixtures/dispatch/<device>.json)"
KIND, TABLE_KIND = "tune-table", "dispatch-table"
MODES = ("eager", "graph")


def claims_tune(raw) -> bool:
    return isinstance(raw, dict) and isinstance(raw.get("rows"), list) and "ranked_by" in raw and "device" in raw


def claims_table(raw) -> bool:
    return isinstance(raw, dict) and str(raw.get("schema", "")).startswith("qwen36-dispatch/")


def _sweeps_figure(name: str, values: list[float], mode: str, gated: bool, all_values: list[float]) -> Figure:
    """A point's sweep medians: their median, their range, and the tolerance a check sizes from `all_values`
    (every run's values at the point in the table)."""
    low, high = min_max(values)
    return Figure(name, statistics.median(values), "us", "lower", low, high,
                  f"min..max of {len(values)} sweeps" if low is not None else "",
                  relative(tolerance(all_values, mode)), gated)


def from_tune_payload(raw: dict, given: Given, source: str) -> list[Record]:
    table = raw.get("table") or {}
    timings = table.get("timings") or {}
    rows = [r for r in raw.get("rows", []) if r.get("status") == "ok" and recordable_row(r["block"], r["path"])]
    recorded = {(r["block"], int(r["key"]), r["path"]) for r in rows}
    has_graph = any(r.get("graph_sweeps_us") for r in rows)
    # Gated only by the table this run wrote; a run that wrote none (--no-table, a subset) gates nothing.
    gated = gated_points(table, recorded) if timings else set()
    mode_gated = gated_mode(table, has_graph)
    figures, seen = [], set()
    for r in rows:
        point = (r["block"], int(r["key"]), r["path"])
        for mode in MODES:
            name = point_metric(*point, mode)
            sweeps = [float(v) for v in r.get(f"{mode}_sweeps_us") or ()]
            if sweeps:
                f = _sweeps_figure(name, sweeps, mode, point in gated and mode == mode_gated, sweeps)
            elif isinstance(r.get(mode), dict) and r[mode].get("median_us") is not None:
                # Runs before sweeps were kept (2026-12-01): one sweep's median and its IQR, no gate to size.
                t = r[mode]
                f = Figure(name, float(t["median_us"]), "us", "lower", t.get("p25_us"), t.get("p75_us"),
                           f"IQR of {t.get('samples')} samples", None, False)
            else:
                continue
            if f.metric not in seen:
                seen.add(f.metric)
                figures.append(f)
    if not figures:
        blocks = sorted({r.get("block") for r in raw.get("rows", [])})
        raise NoFigures(f"{source}: no correct row of a block a table records ({', '.join(RECORDED_BLOCKS)}); "
                        f"this run timed {', '.join(map(str, blocks)) or 'nothing'}"
                        + (" (a Triton config sweep)" if "config_sweep" in raw else ""))
    runs = timings.get("runs") or [{}]
    date, notes = run_date(raw.get("date"), given, source)
    commit, how = given.commit_and_how(None, "not recorded: tune.json names no commit")
    machine = device_machine(raw.get("device"), gpu_detail(runs[0].get("gpu_uuid"), raw.get("torch")))
    notes += [f"dims {(raw.get('dims') or {}).get('name')}, dtype {raw.get('dtype')}, ranked by {raw.get('ranked_by')}",
              "table written: " + (str(raw.get("table_path")) if timings else "none with timings (nothing gated)")]
    return [build_record(kind=KIND, date=date, commit=commit, commit_source=how, machine=given.machine_or(machine),
                         command=raw.get("command", ""), source=source, figures=figures, notes=notes)]


def from_table_payload(raw: dict, given: Given, source: str) -> list[Record]:
    timings = raw.get("timings") or {}
    points = timings.get("points") or []
    if not points:
        raise NoFigures(f"{source}: schema {raw.get('schema')} holds the ranges only, no timings (tables record them "
                        "from qwen36-dispatch/2 on)")
    by_run: dict[int, list[tuple[tuple[str, int, str], str, list[float]]]] = {}
    every: dict[tuple[str, int, str, str], list[float]] = {}
    for p in points:
        point = (p["block"], int(p["key"]), p["path"])
        for e in p.get("runs", []):
            for mode in MODES:
                values = [float(v) for v in e.get(f"{mode}_us") or ()]
                if values:
                    by_run.setdefault(int(e["run"]), []).append((point, mode, values))
                    every.setdefault((*point, mode), []).extend(values)
    recorded = {(p["block"], int(p["key"]), p["path"]) for p in points}
    gated = gated_points(raw, recorded)
    mode_gated = gated_mode(raw, any(m == "graph" for (*_, m) in every))
    records = []
    for meta in timings.get("runs", []):
        rows = by_run.get(int(meta["id"]), [])
        figures = [_sweeps_figure(point_metric(*point, mode), values, mode, point in gated and mode == mode_gated,
                                  every[(*point, mode)]) for point, mode, values in rows]
        if not figures:
            continue
        date, notes = run_date(meta.get("date"), given, source)
        commit, how = given.commit_and_how(None, f"not recorded: run {meta['id']} of the table names no commit")
        machine = device_machine(meta.get("device") or raw.get("device"),
                                 gpu_detail(meta.get("gpu_uuid"), meta.get("torch")))
        notes.append(f"run {meta['id']} of {len(timings.get('runs', []))} in the table's timings (host "
                     f"{meta.get('host')}, {meta.get('sweeps')} sweeps)")
        if meta.get("added_from"):
            notes.append(f"added from {meta['added_from']}")
        records.append(build_record(kind=TABLE_KIND, date=date, commit=commit, commit_source=how,
                                    machine=given.machine_or(machine), command=meta.get("command", ""),
                                    source=source, figures=figures, notes=notes))
    if not records:
        raise NoFigures(f"{source}: its timings name no run that holds a value")
    return records
