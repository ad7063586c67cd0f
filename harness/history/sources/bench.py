"""`qwen36 bench`'s run directory (harness/bench/run.py write_outputs: manifest.json, summary.json) and the live
gate's, which is the same directory with the gate's report beside it (tests/perf_gates/test_gate_live.py runs
run_bench, then harness/gates/gate.py write_report puts gate.json there): nothing else distinct.

Per point, the platform's metrics (harness/bench/metrics.py, those shown in `gates`: success_rate, ttft_p90,
output_tps_p10, cache_hit_rate, weighted_throughput, as summary.json names them): the median over the repeats
(summary.json's `table`) and their min..max. Drawn, not gated, unless the run holds the live gate's gate.json:
then the checks it made are gated at their relative tolerances.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import yaml

from harness.errors import HarnessError
from harness.history.machines import cpu_machine, machine_from_kind_text, server_machine
from harness.history.record import Figure, Machine, Record
from harness.history.sources.common import (
    Given, NoFigures, build_record, dirty_note, load_json, metric, min_max, point_segments, relative, run_date,
    source_of,
)
from harness.paths import BASELINES_DIR

__all__ = ["FILES", "WRITER", "find", "read", "hardware_of_profile"]

FILES = ("manifest.json", "summary.json")
WRITER = ("`qwen36 bench` (harness/bench/run.py) and the live gate (tests/perf_gates/test_gate_live.py, which adds "
          "gate.json)")


def find(path: Path) -> Path | None:
    path = Path(path)
    folder = path.parent if path.is_file() else path
    return folder if all((folder / name).is_file() for name in FILES) else None


def hardware_of_profile(profile: str, baselines: Path = BASELINES_DIR) -> str | None:
    """The hardware a recorded profile names (fixtures/baselines/<profile>.yaml identity.hardware), or None."""
    try:
        raw = yaml.safe_load((Path(baselines) / f"{profile}.yaml").read_text()) or {}
        return (raw.get("identity") or {}).get("hardware")
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def _live_gate(folder: Path) -> dict | None:
    """The live gate's report (harness/gates/gate.py GateReport.as_dict: `profile`, `rows`), or None."""
    try:
        report = json.loads((folder / "gate.json").read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and "profile" in report and isinstance(report.get("rows"), list) else None


def _machine(folder: Path, manifest: dict, profile: str | None) -> tuple[Machine, list[str]]:
    """The embedded server or one on this machine: the CPU's kind (the speed probe's line where the run measured
    it); a server elsewhere: the hardware its profile records, else its host:port."""
    from harness.bench.run import on_this_machine

    base_url = (manifest.get("server") or {}).get("base_url") or ""
    if base_url and not on_this_machine(base_url):
        return server_machine(base_url, hardware_of_profile(profile) if profile else None), []
    probe = (manifest.get("machine_speed") or {}).get("machine")
    if probe:
        return machine_from_kind_text(probe), []
    if (folder / "machine.txt").is_file():
        return machine_from_kind_text((folder / "machine.txt").read_text()), []
    here = cpu_machine()
    return here, [f"machine: the run records no CPU; this machine's at `history add` ({here.kind})"]


def read(path: Path, given: Given) -> list[Record]:
    from harness.bench.metrics import REGISTRY, shown_in

    folder = find(path)
    if folder is None:
        raise HarnessError(f"{path}: not a bench run directory (it needs {' and '.join(FILES)}); {WRITER} write one")
    manifest = load_json(folder / "manifest.json", WRITER)
    summary = load_json(folder / "summary.json", WRITER)
    gate = _live_gate(folder)
    checks = {(r["point"], r["metric"]): r.get("tolerance") or {} for r in (gate or {}).get("rows", [])}
    figures = []
    for point, data in (summary.get("points") or {}).items():
        repeats = data.get("repeats") or []
        table = data.get("table") or {}
        for name in shown_in("gates"):
            values = [float(r[name]) for r in repeats if isinstance(r.get(name), (int, float))
                      and not isinstance(r.get(name), bool)]
            if not values:
                continue
            value = table.get(name) if isinstance(table.get(name), (int, float)) else statistics.median(values)
            low, high = min_max(values)
            tol = checks.get((point, name))
            spec = REGISTRY[name]
            figures.append(Figure(metric("bench", *point_segments(point), name), float(value), spec.unit,
                                  spec.direction, low, high,
                                  f"min..max of {len(values)} repeats; value: their median" if low is not None else "",
                                  relative(tol.get("value")) if tol and tol.get("scale") == "relative" else None,
                                  tol is not None))
    if not figures:
        raise NoFigures(f"{folder}: no point with a platform metric ({summary.get('end_reason')})")
    harness = manifest.get("harness") or {}
    base_url = (manifest.get("server") or {}).get("base_url") or ""
    profile = gate.get("profile") if gate else None
    machine, notes = _machine(folder, manifest, profile)
    commit, how = given.commit_and_how(harness.get("commit"), "run manifest (harness.commit)")
    date, date_notes = run_date(manifest.get("created"), given, folder / "manifest.json")
    remote = bool(base_url) and machine.kind.startswith("server:")
    datasets = ", ".join(f"{d.get('name')} {str(d.get('sha256'))[:12]}" for d in manifest.get("datasets") or [])
    notes += [*dirty_note(harness),
              *(["the commit is the client's checkout; what the server ran is not in the run"] if remote else []),
              *([f"live gate against {profile!r}: {'pass' if gate.get('passed') else 'REGRESSION'}"] if gate else []),
              f"datasets: {datasets or 'not recorded'}",
              *date_notes]
    if gate:
        kind = "live-gate"
        command = f"pytest tests/perf_gates/test_gate_live.py --server-url {base_url} --baseline-profile {profile}"
    else:
        kind, command = "bench", "qwen36 bench" + (f" --base-url {base_url}" if remote else "")
    return [build_record(kind=kind, date=date, commit=commit, commit_source=how, machine=given.machine_or(machine),
                         command=command, source=given.source or source_of(folder, given.repo), figures=figures,
                         notes=notes)]
