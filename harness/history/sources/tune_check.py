"""`qwen36 tune --check` and `--check-stale` (harness/tune/check/run.py): check.json, one figure per point verdict.

A figure is the check's measured time of one (block, key, path, mode), the median of its sweeps, named as the
tuner's tables name the point (gpu_names.point_metric), so a check's line continues a table's. The stale-table
verdicts compare paths within the run and measure nothing new: they give no figure.
"""
from __future__ import annotations

from harness.history.machines import device_machine
from harness.history.record import Figure, Record
from harness.history.sources.common import Given, build_record, min_max, relative, run_date
from harness.history.sources.gpu_names import gpu_detail, point_metric

__all__ = ["FILES", "WRITER", "KIND", "claims", "from_payload"]

FILES = ("check.json",)
WRITER = "`qwen36 tune --check` (harness/tune/check/run.py)"
KIND = "tune-check"


def claims(raw) -> bool:
    """A check.json by its fields (reports keep some under other names); `qwen36 tune --ab`'s has `sides`."""
    return isinstance(raw, dict) and isinstance(raw.get("verdicts"), list) and "kind" in raw and "sides" not in raw


def _figure(v: dict) -> Figure | None:
    if v.get("measured_us") is None or "mode" not in v or "path" not in v:
        return None  # a StaleVerdict (chosen against best, within the run), or a point that did not run
    # A composed MoE block row judged against the table's path reads "<row path> (table: <path>)": the row measured.
    path = str(v["path"]).split(" (table: ")[0]
    sweeps = [float(x) for x in v.get("measured_sweeps_us") or ()]
    low, high = min_max(sweeps)
    return Figure(point_metric(v["block"], v["key"], path, v["mode"]), float(v["measured_us"]), "us", "lower",
                  low, high, f"min..max of {len(sweeps)} sweeps" if low is not None else "",
                  relative(v.get("tolerance")), bool(v.get("gated", True)))  # files before `gated`: all were gated


def from_payload(raw: dict, given: Given, source: str) -> list[Record]:
    figures, seen, notes = [], set(), []
    for v in raw.get("verdicts", []):
        f = _figure(v)
        if f is None:
            continue
        if f.metric in seen:
            notes.append(f"{f.metric}: a second verdict in the run, left out")
            continue
        seen.add(f.metric)
        figures.append(f)
    detail = gpu_detail((raw.get("machine") or {}).get("gpu_uuid"), raw.get("torch"))
    date, date_notes = run_date(raw.get("date"), given, source)
    commit, how = given.commit_and_how(None, "not recorded: check.json names no commit")
    if raw.get("injected"):
        notes.append(f"injected delays (a deliberately slowed run): {'; '.join(map(str, raw['injected']))}")
    notes += [f"{raw.get('kind', 'check')} against {raw.get('table')}: {'pass' if raw.get('passed') else 'FAIL'}",
              *date_notes]
    return [build_record(kind=KIND, date=date, commit=commit, commit_source=how,
                         machine=given.machine_or(device_machine(raw.get("device"), detail)),
                         command=raw.get("command", ""), source=source, figures=figures, notes=notes)]
