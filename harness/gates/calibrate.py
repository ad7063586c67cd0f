"""`qwen36 calibrate`: what CI's paired gates can see on this machine, measured, and the tolerances sized from it.

Each run is one interleaved measurement of CI's design (the `paired` preset, fixtures/gates/paired.yaml's pairs) on
three arms: A (a server), B (the same server started separately) and B slowed (its test-only step slowdown at one
of `sizes`, decode steps for decode-micro's blocks and prefill steps for official-like's, the sizes taken in turn).
Both servers are started again every `restart_every` runs, so the controls hold the start-to-start offsets that a
CI run's two separate starts have. A run gives one A/A control (B against A) and one detection (B slowed against A).

The report (report.md, results.jsonl) gives:
- per check, the tolerance that `margin_from_controls` sizes from the controls' mean pair differences (what
  `--write` puts into fixtures/gates/paired.yaml);
- the A/A false alarms, each control decided with tolerances sized from the other controls (leave one out, so no
  control is judged by a tolerance it helped size);
- per slowdown size, how often each metric is flagged, at tolerances sized from the controls of the other runs.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.bench.artifacts import new_run_dir
from harness.bench.run import PRESETS
from harness.gates.decision import Tolerance
from harness.gates.interleave import Arm, interleave
from harness.gates.measure import STEADY_PREFIX_CACHE, warm
from harness.gates.paired import PairedTolerances, decide_differences, margin_from_controls, paired_gate
from harness.machine.speed import machine_kind
from harness.bench.metrics import REGISTRY
from harness.gates.gate import FAMILY_ALPHA
from harness.paths import PAIRED_TOLERANCES_FILE
from harness.serving.launcher import embedded_server
from harness.serving.shared_server import SESSION_KV_GIB, embedded_env, info_of

PRESET = "paired"
A, B, SLOWED = "A", "B", "B-slowed"


@dataclass(frozen=True)
class CalibrationPlan:
    runs: int = 30
    restart_every: int = 3
    sizes: tuple[float, ...] = (0.1, 0.2)


def run_calibration(plan: CalibrationPlan, out_root: Path, resume: Path | None = None) -> Path:
    """Measure the plan's runs into a new directory under `out_root`, or on after the runs that `resume` (a
    directory this wrote) already holds; returns the directory (results.jsonl grows per run)."""
    root = Path(resume) if resume else new_run_dir(out_root, "calibrate")
    done = len(load_results(root)) if resume else 0
    tolerances = PairedTolerances.load()
    from harness.serving.tiny_model import build_tiny_model

    model = build_tiny_model(root / "tiny-model")
    servers = {}
    try:
        for i in range(done, plan.runs):
            if not servers or i % plan.restart_every == 0:
                for s in servers.values():
                    s.stop()
                servers = _start_pair(root, model, i)
                infos = {name: info_of(s, str(model)) for name, s in servers.items()}
                for info in infos.values():
                    warm(info, STEADY_PREFIX_CACHE, root / "warm")
            size = plan.sizes[i % len(plan.sizes)]
            arms = [Arm(A, infos[A], lambda point: ""), Arm(B, infos[B], lambda point: ""),
                    Arm(SLOWED, infos[B], lambda point, f=size: f"decode={f}" if point.startswith("decode")
                        else f"prefill={f}")]
            began = time.monotonic()
            run = interleave(arms, PRESETS[PRESET], tolerances.pairs, root / "runs", f"run{i:02d}",
                             show_progress=True)
            row = {"run": i, "start": i // plan.restart_every, "size": size, "seconds": round(time.monotonic() - began),
                   "path": str(run.path), "end_reason": run.end_reason,
                   "control": _differences(run.path, B, tolerances), "slowed": _differences(run.path, SLOWED, tolerances)}
            with open(root / "results.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"run {i}: {row['seconds']} s, size {size}", file=sys.stderr)
    finally:
        for s in servers.values():
            s.stop()
    return root


def _start_pair(root: Path, model: Path, i: int) -> dict:
    """A and B, started together: B on the mirrored layout, so the two compile on different cores, then moved to
    the layout (harness.serving.launcher's start_mirrored)."""
    servers = {name: embedded_server(root, model, root / f"start{i:02d}-{name}.log", cpu_kvcache_gib=SESSION_KV_GIB,
                                     env=embedded_env(root, f"{name}-{i}"), start_mirrored=name == B)
               for name in (A, B)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        started = [pool.submit(s.start) for s in servers.values()]
    for future in started:
        future.result()
    return servers


def _differences(run_path: Path, arm: str, tolerances: PairedTolerances) -> dict:
    """Per check (point:metric), the pair differences of `arm` against A (None where insufficient)."""
    report = paired_gate(run_path, A, arm, tolerances)
    return {f"{r.point}:{r.metric}": (r.differences if not r.insufficient else None) for r in report.rows}


def load_results(directory: Path) -> list[dict]:
    path = Path(directory) / "results.jsonl"
    if not path.exists():
        from harness.errors import HarnessError

        raise HarnessError(f"{directory} has no results.jsonl: give a directory `qwen36 calibrate` wrote")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class CheckCalibration:
    check: str  # point:metric
    scale: str
    direction: str
    control_means: list[float]
    margin: float  # sized from every control
    tolerance: Tolerance  # max(the file's floor: policy, what the controls need)


def _mean(d: list[float] | None) -> float | None:
    return statistics.fmean(d) if d else None


def analyse(results: list[dict], tolerances: PairedTolerances, family_alpha: float = FAMILY_ALPHA) -> dict:
    """Sized tolerances, leave-one-out A/A false alarms and detection per size (see the module docstring)."""
    checks = list(results[0]["control"])
    alpha = family_alpha / len(checks)
    calibrations = {}
    for check in checks:
        point, metric = check.split(":")
        floor = tolerances.floor(point, metric)
        direction = REGISTRY[metric].direction
        means = [m for r in results if (m := _mean(r["control"].get(check))) is not None]
        margin = margin_from_controls(means, alpha) if len(means) >= 3 else float("nan")
        sized = _as_tolerance(margin, floor.scale, direction)
        tol = sized if sized is not None and sized.value > floor.value else floor
        calibrations[check] = CheckCalibration(check, floor.scale, direction, means, margin, tol)

    def loo_margin(check: str, k: int) -> float:
        cal = calibrations[check]
        others = [m for r in results if r["run"] != k and (m := _mean(r["control"].get(check))) is not None]
        sized = margin_from_controls(others, alpha) if len(others) >= 3 else 0.0
        floor = tolerances.floor(*check.split(":")).margin(cal.direction)
        return max(sized, floor)

    controls, detections = [], {}
    for r in results:
        verdicts = {}
        for check in checks:
            d = r["control"].get(check)
            verdicts[check] = "insufficient" if d is None else decide_differences(d, loo_margin(check, r["run"]),
                                                                                 alpha)[0]
        controls.append({"run": r["run"], "start": r["start"], "verdicts": verdicts,
                         "false_alarm": any(v in ("regression", "insufficient") for v in verdicts.values())})
        for check in checks:
            d = r["slowed"].get(check)
            verdict = "insufficient" if d is None else decide_differences(d, loo_margin(check, r["run"]), alpha)[0]
            detections.setdefault((r["size"], check), []).append((verdict, _mean(d)))
    return {"alpha": alpha, "checks": calibrations, "controls": controls, "detections": detections,
            "runs": len(results), "starts": len({r["start"] for r in results})}


def _as_tolerance(margin: float, scale: str, direction: str) -> Tolerance | None:
    """The tolerance whose margin (Tolerance.margin) is `margin`."""
    if not margin > 0 or math.isnan(margin):
        return None
    if scale == "absolute":
        return Tolerance(round(margin, 4), "absolute")
    value = math.expm1(margin) if direction == "lower" else -math.expm1(-margin)
    return Tolerance(round(value, 4), "relative") if value < 1 else None


def _change(mean_difference: float | None, scale: str, direction: str) -> str:
    if mean_difference is None:
        return "n/a"
    if scale == "absolute":
        return f"{(-mean_difference if direction == 'higher' else mean_difference):+.3f}"
    return f"{math.expm1(-mean_difference if direction == 'higher' else mean_difference):+.1%}"


def report_markdown(analysis: dict, how: str) -> str:
    checks = analysis["checks"]
    lines = [f"# Paired gate calibration: {analysis['runs']} runs, {analysis['starts']} server starts of each arm",
             "", f"Machine: {machine_kind()}. Command: `{how}`. Each check at alpha {analysis['alpha']:.4g}.", "",
             "## Tolerances sized from the A/A controls", "",
             "| check | controls | rms of control means | sized margin | tolerance |", "|---|---:|---:|---:|---:|"]
    for cal in checks.values():
        rms = math.sqrt(statistics.fmean(m * m for m in cal.control_means)) if cal.control_means else float("nan")
        lines.append(f"| {cal.check} | {len(cal.control_means)} | {rms:.4f} | {cal.margin:.4f} | "
                     f"{cal.tolerance.describe()} |")
    alarms = [c for c in analysis["controls"] if c["false_alarm"]]
    lines += ["", f"## A/A false alarms: {len(alarms)} of {len(analysis['controls'])} controls", "",
              "Each control decided with every check's tolerance sized from the other controls (leave one out)."]
    for c in alarms:
        bad = {k: v for k, v in c["verdicts"].items() if v != "pass"}
        lines.append(f"- run {c['run']} (start {c['start']}): {bad}")
    lines += ["", "## Detection of the slowed twin", "",
              "| size | check | flagged | mean change |", "|---:|---|---:|---:|"]
    for (size, check), rows in sorted(analysis["detections"].items()):
        cal = checks[check]
        flagged = sum(v == "regression" for v, _ in rows)
        means = [m for _, m in rows if m is not None]
        lines.append(f"| {size:g} | {check} | {flagged}/{len(rows)} | "
                     f"{_change(statistics.fmean(means) if means else None, cal.scale, cal.direction)} |")
    return "\n".join(lines) + "\n"


def write_tolerances(analysis: dict, how: str, path: Path = PAIRED_TOLERANCES_FILE) -> None:
    """Put the sized tolerances into fixtures/gates/paired.yaml, with how and where they were measured."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    for cal in analysis["checks"].values():
        point, metric = cal.check.split(":")
        raw.setdefault("points", {}).setdefault(point, {})[metric] = {"value": cal.tolerance.value,
                                                                      "scale": cal.tolerance.scale}
    raw["measured"] = {"machine": machine_kind(), "runs": analysis["runs"], "starts": analysis["starts"],
                       "command": how, "date": time.strftime("%Y-%m-%d")}
    header = "".join(line + "\n" for line in Path(path).read_text().splitlines() if line.startswith("#"))
    Path(path).write_text(header + yaml.safe_dump(raw, sort_keys=False))
