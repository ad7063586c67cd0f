"""`qwen36 calibrate`: what CI's paired gates can see on this machine, measured, and the tolerances sized from it.

Each run is one interleaved measurement of CI's design (the `paired` preset, fixtures/gates/paired.yaml's pairs) on
three arms: A (a server), B (the same server started separately) and B slowed (its test-only step slowdown at one
of `sizes`, decode steps for decode-micro's blocks and prefill steps for official-like's, the sizes taken in turn).
Both servers are started again every `restart_every` runs, so the controls hold the start-to-start offsets that a
CI run's two separate starts have. A run gives one A/A control (B against A) and one detection (B slowed against A).

The report (report.md, results.jsonl) gives:
- per check, the tolerance that `margin_for_pairs` sizes from the controls' pair differences for a gate of
  fixtures/gates/paired.yaml's `pairs` (what `--write` puts into that file): the controls' spread split into the
  start-to-start offset and the pairs' own spread, so controls shorter than the gate size it for the gate's pairs;
- the A/A false alarms, each control decided with tolerances sized from the other controls (leave one out, so no
  control is judged by a tolerance it helped size);
- per slowdown size, how often each metric is flagged, at tolerances sized from the controls of the other runs;
- "two looks": the same with the confirmation round's rule (harness.gates.confirm), a first look confirmed by its
  pairs pooled with another run's. For the controls the other run is the next one of the same two server starts,
  as a confirmation re-measures the same servers; for detection it is the next run of the same size, which came
  from the next starts (sizes are taken in turn), so its start offsets are independent where a confirmation's
  are not.
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
from harness.gates.paired import (OFFSET_BOUND, ControlSpread, PairedTolerances, control_spread, decide_differences,
                                  margin_for_pairs, paired_gate)
from harness.machine.speed import machine_kind
from harness.bench.metrics import REGISTRY
from harness.gates.gate import FAMILY_ALPHA
from harness.paths import PAIRED_TOLERANCES_FILE
from harness.serving.launcher import embedded_server
from harness.serving.shared_server import SESSION_KV_GIB, embedded_env, info_of

PRESET = "paired"
A, B, SLOWED = "A", "B", "B-slowed"
# The machine kind the runs were measured on, kept with them: an analysis made later, elsewhere, reports it.
MACHINE_FILE = "machine.txt"


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
    if not (root / MACHINE_FILE).exists():
        (root / MACHINE_FILE).write_text(machine_kind() + "\n")
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


def measured_on(directory: Path) -> str:
    """The machine kind a calibration directory's runs were measured on, as run_calibration recorded it."""
    path = Path(directory) / MACHINE_FILE
    return path.read_text().strip() if path.exists() else f"not recorded (analysed on {machine_kind()})"


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
    spread: ControlSpread | None  # None with fewer than 3 controls
    pairs: int  # the gate's pairs, what the margin is sized for
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
        measured = [(d, r["start"]) for r in results if (d := r["control"].get(check))]
        controls, starts = [d for d, _ in measured], [s for _, s in measured]
        means = [statistics.fmean(d) for d in controls]
        enough = len(controls) >= 3
        margin = margin_for_pairs(controls, alpha, tolerances.pairs, starts) if enough else float("nan")
        sized = _as_tolerance(margin, floor.scale, direction)
        tol = sized if sized is not None and sized.value > floor.value else floor
        calibrations[check] = CheckCalibration(check, floor.scale, direction, means,
                                               control_spread(controls, starts) if enough else None, tolerances.pairs,
                                               margin,
                                               tol)

    def loo_margin(check: str, k: int) -> float:
        cal = calibrations[check]
        others = [(d, r["start"]) for r in results if r["run"] != k and (d := r["control"].get(check))]
        sized = margin_for_pairs([d for d, _ in others], alpha, tolerances.pairs, [s for _, s in others]) \
            if len(others) >= 3 else 0.0
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
    two_looks = {}
    for i, j in _look_pairs(results, lambda a, b: a["start"] == b["start"]):
        for check in checks:
            two_looks.setdefault(("control", check), []).append(
                _two_looks(i["control"].get(check), j["control"].get(check), loo_margin(check, i["run"]), alpha))
    for i, j in _look_pairs(results, lambda a, b: a["size"] == b["size"]):
        for check in checks:
            two_looks.setdefault((i["size"], check), []).append(
                _two_looks(i["slowed"].get(check), j["slowed"].get(check), loo_margin(check, i["run"]), alpha))
    return {"alpha": alpha, "checks": calibrations, "controls": controls, "detections": detections,
            "two_looks": two_looks, "runs": len(results), "starts": len({r["start"] for r in results}),
            "control_pairs": _control_pairs(results)}


def _control_pairs(results: list[dict]) -> int:
    """The pairs each control measured (the most any control has: a run cut short has fewer)."""
    return max((len(d) for r in results for d in r["control"].values() if d), default=0)


def _gate_pairs(checks: dict) -> int:
    return next(iter(checks.values())).pairs if checks else 0


def _look_pairs(results: list[dict], same) -> list[tuple[dict, dict]]:
    """Each run with the next later run that `same` holds for: a first look and the run that confirms it."""
    pairs = []
    for k, first in enumerate(results):
        later = [r for r in results[k + 1:] if same(first, r)]
        if later:
            pairs.append((first, later[0]))
    return pairs


def _two_looks(first: list[float] | None, second: list[float] | None, margin: float, alpha: float) -> tuple[bool, bool]:
    """(flagged by the first look, flagged by the first look and by both runs' pairs pooled)."""
    if first is None or second is None:
        return False, False
    flagged = decide_differences(first, margin, alpha)[0] == "regression"
    return flagged, flagged and decide_differences(first + second, margin, alpha)[0] == "regression"


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


def report_markdown(analysis: dict, how: str, machine: str) -> str:
    checks = analysis["checks"]
    lines = [f"# Paired gate calibration: {analysis['runs']} runs, {analysis['starts']} server starts of each arm",
             "", f"Machine: {machine}. Command: `{how}`. Each check at alpha {analysis['alpha']:.4g}.", "",
             "## Tolerances sized from the A/A controls", "",
             "Each control's mean pair difference is a start-to-start offset plus the mean of its pairs' noise; the "
             "two are told apart (harness.gates.paired.control_spread) and put together again for a gate of "
             f"{_gate_pairs(checks)} pairs, the margin `margin_for_pairs` sizes, with the offset at its "
             f"{OFFSET_BOUND:.0%} upper confidence bound over the server starts.", "",
             "| check | controls | pairs per control | rms of control means | start offset (sd) | its "
             f"{OFFSET_BOUND:.0%} bound | pair spread (sd) | sized margin | tolerance |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for cal in checks.values():
        rms = math.sqrt(statistics.fmean(m * m for m in cal.control_means)) if cal.control_means else float("nan")
        nan = float("nan")
        offset, bound, pair = ((cal.spread.offset_sd, cal.spread.offset_bound, cal.spread.pair_sd) if cal.spread
                               else (nan, nan, nan))
        lines.append(f"| {cal.check} | {len(cal.control_means)} | {analysis['control_pairs']} | {rms:.4f} | "
                     f"{offset:.4f} | {bound:.4f} | {pair:.4f} | {cal.margin:.4f} | {cal.tolerance.describe()} |")
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
    lines += ["", "## Two looks: the confirmation round's rule", "",
              "A first look's flag is confirmed by its pairs pooled with another run's: for a control, the next run "
              "of the same two starts; for a slowdown, the next run of the same size (the next starts).", "",
              "| arm | check | look pairs | flagged by the first look | confirmed |", "|---|---|---:|---:|---:|"]
    for (arm, check), rows in sorted(analysis["two_looks"].items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        name = "A/A control" if arm == "control" else f"slowed {arm:g}"
        lines.append(f"| {name} | {check} | {len(rows)} | {sum(f for f, _ in rows)} | {sum(c for _, c in rows)} |")
    return "\n".join(lines) + "\n"


def write_tolerances(analysis: dict, how: str, machine: str, path: Path = PAIRED_TOLERANCES_FILE) -> None:
    """Put the sized tolerances into fixtures/gates/paired.yaml, with how and where they were measured."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    for cal in analysis["checks"].values():
        point, metric = cal.check.split(":")
        raw.setdefault("points", {}).setdefault(point, {})[metric] = {"value": cal.tolerance.value,
                                                                      "scale": cal.tolerance.scale}
    # `measured.pairs`: the rounds each control measured; the tolerances are sized for the gate's `pairs`.
    raw["measured"] = {"pairs": analysis["control_pairs"], "machine": machine, "runs": analysis["runs"],
                       "starts": analysis["starts"], "command": how, "date": time.strftime("%Y-%m-%d"),
                       # What each tolerance was sized from (harness.gates.paired.ControlSpread), on the log scale
                       # (points for a rate): the simulations of tests/unit/test_gate_power.py read them.
                       "spreads": {cal.check: {"offset_sd": round(cal.spread.offset_sd, 4),
                                               "offset_bound": round(cal.spread.offset_bound, 4),
                                               "pair_sd": round(cal.spread.pair_sd, 4)}
                                   for cal in analysis["checks"].values() if cal.spread is not None}}
    header = "".join(line + "\n" for line in Path(path).read_text().splitlines() if line.startswith("#"))
    Path(path).write_text(header + yaml.safe_dump(raw, sort_keys=False))
