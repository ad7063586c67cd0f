"""The records as asv's results (schema 2), so that asv's own `publish` draws them and finds their steps.

asv publish reads `results/benchmarks.json`, `results/<machine>/machine.json` and one file per run,
`results/<machine>/<commit[:8]>-<env>.json`, with `result_columns` and `results`; it never runs anything. Each
record becomes one file (env `run-<identity>`), so two runs of one commit on one machine are averaged, as asv does.

Every metric is a benchmark with one parameter, `band`: `value` (the figure, which asv's step detection judges),
and `low` and `high` (its spread), drawn as lines beside it because asv's plot has no error bars. The value's
confidence interval is the low..high band too, which asv turns into the point's weight in its step detection.

Higher-is-better figures are handed to asv as a lower-is-better image (asv only knows "an upward step is a
regression"); directions.py says which, and turns every published number back into the figure as measured.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from harness.history.record import Figure, Record
from harness.history.site.catalog import Metric
from harness.history.site.directions import drawable, to_asv

BANDS = ("value", "low", "high")
ENV_PREFIX = "run-"
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b"]


def machine_slug(kind: str) -> str:
    """The machine kind as asv's machine name (a folder, a URL parameter): `gpu: NVIDIA H200` -> `gpu-nvidia-h200`."""
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")


@dataclass(frozen=True)
class Placed:
    record: Record
    commit_ms: int  # the commit's date, asv's x axis


def _bands(f: Figure, metric: Metric) -> tuple[list, list, list]:
    """(values, ci low, ci high) per band, on asv's scale."""
    values = [to_asv(f.value, metric), to_asv(f.low, metric), to_asv(f.high, metric)]
    lo, hi = sorted(v for v in values[1:] if v is not None) if None not in values[1:] else (None, None)
    ci_ok = lo is not None and hi is not None and hi > lo
    return values, [lo if ci_ok else None, None, None], [hi if ci_ok else None, None, None]


def write_results(results_dir: Path, placed: list[Placed], catalog: dict[str, Metric]) -> list[str]:
    """Write benchmarks.json, machine.json per machine and one result file per record; returns what was left out."""
    left_out = []
    results_dir.mkdir(parents=True, exist_ok=True)
    machines: dict[str, str] = {}
    for item in placed:
        record = item.record
        slug = machine_slug(record.machine.kind)
        machines[slug] = record.machine.kind
        results = {}
        for f in record.figures:
            metric = catalog[f.metric]
            if not all(drawable(x, metric) for x in (f.value, f.low, f.high) if x is not None):
                left_out.append(f"{record.source}: {f.metric} = {f.value:g} (higher is better, and 0 has no "
                                "reciprocal on asv's scale)")
                continue
            values, ci_a, ci_b = _bands(f, metric)
            results[f.metric] = [values, [list(BANDS)], "1", _iso_ms(record.date), None, ci_a, ci_b]
        if not results:
            continue
        payload = {"commit_hash": record.commit, "env_name": ENV_PREFIX + record.identity, "date": item.commit_ms,
                   "params": {"machine": slug}, "python": "", "requirements": {}, "env_vars": {},
                   "result_columns": COLUMNS, "results": results, "durations": {}, "version": 2}
        path = results_dir / slug / f"{record.commit[:8]}-{ENV_PREFIX}{record.identity}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, sort_keys=True))
    for slug, kind in machines.items():
        (results_dir / slug / "machine.json").write_text(json.dumps(
            {"machine": slug, "cpu": kind, "os": "", "arch": "", "num_cpu": "", "ram": "", "version": 1}))
    benchmarks = {name: _benchmark(metric) for name, metric in catalog.items()}
    (results_dir / "benchmarks.json").write_text(json.dumps({**benchmarks, "version": 2}, sort_keys=True))
    return left_out


def _benchmark(metric: Metric) -> dict:
    better = "higher" if metric.higher_is_better else "lower"
    judged = (f"a worsening of {metric.threshold:.1%} or more is marked as a regression" if metric.gated
              else "not gated: drawn, never marked")
    code = (f"{metric.name}\n\nunit: {metric.unit}; {better} is better; {judged}.\n"
            f"measured by: {', '.join(metric.kinds)}.\n"
            "band: value is the figure; low and high are its spread, as each run's record says.\n"
            "Click a point, then its commit, for the runs behind it.")
    return {"name": metric.name, "pretty_name": metric.name, "type": "track", "unit": metric.unit,
            "params": [list(BANDS)], "param_names": ["band"], "version": "1", "code": code, "timeout": 60}


def _iso_ms(date: str) -> int:
    import datetime as dt

    when = dt.datetime.fromisoformat(date.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() * 1000)
