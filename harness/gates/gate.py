"""Gate candidate runs against a baseline: one decision per (point, gated metric), and a report.

Candidate repeats are every repeat of the point in every run directory given. Runs whose identity differs
from the baseline's are refused with the difference named, unless the difference is accepted by name (and
then the report lists it).

Where the baseline and every candidate run measured harness.machine.speed's probe, the baseline is first
moved to the candidate's day: its speeds multiplied, its times divided, by the probes' ratio (the report says
by how much). A slower commit slows the server, not the probe, so it is still a regression; a slower day slows
both, so it is not. A baseline recorded on another kind of machine (the probe's `machine`) is refused.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from harness.errors import HarnessError
from harness.gates.baseline import Baseline
from harness.gates.decision import Decision, Tolerance, decide
from harness.gates.identity import identity_differences, identity_from_manifest
from harness.machine.speed import MAX_FACTOR
from harness.bench.metrics import REGISTRY, Metric, Scoring


# The gate's false-alarm budget on identical distributions, shared by all its checks.
FAMILY_ALPHA = 0.05


class NotComparable(HarnessError):
    """The candidate runs differ from the baseline in what was measured."""


@dataclass(frozen=True)
class RunDir:
    path: Path
    manifest: dict
    points: dict[str, list[dict]]  # point name -> per-repeat summaries


def load_run(path: Path | str) -> RunDir:
    path = Path(path)
    if not path.is_dir():
        raise HarnessError(f"{path} is not a run directory: it does not exist (give a directory `qwen36 bench` wrote)")
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        summary = json.loads((path / "summary.json").read_text())
    except FileNotFoundError as e:
        raise HarnessError(f"{path} is not a run directory: {Path(e.filename).name} is missing "
                           "(run `qwen36 bench` to make one)") from e
    except json.JSONDecodeError as e:
        raise HarnessError(f"{path}: a JSON file is malformed ({e.msg}); the run may have been cut short") from e
    return RunDir(path, _mapping(manifest, path / "manifest.json"), _points(summary, path / "summary.json"))


def _mapping(value, where: Path) -> dict:
    if not isinstance(value, dict):
        raise HarnessError(f"{where}: expected a JSON object, found {type(value).__name__}; "
                           "the run directory is not one `qwen36 bench` wrote")
    return value


def _points(summary, where: Path) -> dict[str, list[dict]]:
    """summary.json's points -> repeats, checked: a malformed file is bad input (exit 2), not a crash."""
    points = _mapping(summary, where).get("points") or {}
    if not isinstance(points, dict):
        raise HarnessError(f"{where}: 'points' is a {type(points).__name__}, expected an object of points")
    out = {}
    for name, point in points.items():
        repeats = _mapping(point, where).get("repeats") or []
        if not isinstance(repeats, list) or not all(isinstance(r, dict) for r in repeats):
            raise HarnessError(f"{where}: point {name!r}: 'repeats' must be a list of per-repeat summaries")
        out[name] = list(repeats)
    return out


def _numbers(repeats: list[dict], metric: str, where: str) -> list[float]:
    values = [r.get(metric) for r in repeats if r.get(metric) is not None]
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float))]
    if bad:
        raise HarnessError(f"{where} {metric}: {bad[0]!r} is not a number; the run directory is corrupt, "
                           "measure it again")
    return values


@dataclass
class GateRow:
    point: str
    metric: str
    unit: str
    direction: str
    tolerance: Tolerance
    decision: Decision
    target: str | None  # e.g. ">= 20"
    target_met: bool | None

    def as_dict(self) -> dict:
        return {"point": self.point, "metric": self.metric, "unit": self.unit, "direction": self.direction,
                "tolerance": asdict(self.tolerance), "decision": asdict(self.decision),
                "target": self.target, "target_met": self.target_met}


@dataclass
class GateReport:
    profile: str
    runs: list[str]
    rows: list[GateRow]
    accepted_differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    family_alpha: float = FAMILY_ALPHA
    speed_factor: float | None = None  # the candidate machine's probe / the baseline's; None: not rescaled

    @property
    def regressions(self) -> list[GateRow]:
        return [r for r in self.rows if r.decision.verdict == "regression"]

    @property
    def passed(self) -> bool:
        return not self.regressions

    def as_dict(self) -> dict:
        return {"profile": self.profile, "runs": self.runs, "passed": self.passed, "family_alpha": self.family_alpha,
                "accepted_differences": self.accepted_differences, "notes": self.notes,
                "speed_factor": self.speed_factor, "rows": [r.as_dict() for r in self.rows]}


def _pair_points(baseline: Baseline, candidate: dict[str, list[dict]], point_map: dict[str, str]) -> tuple[list, list]:
    pairs, notes = [], []
    if point_map:
        for base_name, cand_name in point_map.items():
            if base_name not in baseline.points or cand_name not in candidate:
                raise HarnessError(f"--point {base_name}={cand_name}: baseline points {sorted(baseline.points)}, "
                                   f"candidate points {sorted(candidate)}")
            pairs.append((base_name, cand_name))
        return pairs, notes
    shared = [name for name in baseline.points if name in candidate]
    if shared:
        pairs = [(n, n) for n in shared]
    elif len(baseline.points) == 1 and len(candidate) == 1:
        (b,), (c,) = baseline.points, candidate
        pairs = [(b, c)]
        notes.append(f"point names differ; the only baseline point {b!r} is compared with the only candidate point {c!r}")
    else:
        raise HarnessError(f"no candidate point matches the baseline's {sorted(baseline.points)} (candidate has "
                           f"{sorted(candidate)}); pair them with --point BASELINE=CANDIDATE")
    for name in baseline.points:
        if name not in {b for b, _ in pairs}:
            notes.append(f"baseline point {name!r} has no candidate: not gated")
    return pairs, notes


def speed_factor(baseline: Baseline, runs: list[RunDir]) -> tuple[float | None, str | None]:
    """How much faster the candidates' machine ran the speed probe than the baseline's (their mean rate over the
    baseline's), and the report's note; (None, note or None) where it cannot be known."""
    base = baseline.machine_speed
    speeds = [r.manifest.get("machine_speed") for r in runs]
    if base is None:
        return None, None
    if any(not s for s in speeds):
        return None, (f"the baseline recorded the machine's speed ({base['rate']:g} {base.get('unit', '')} on "
                      f"{base['probe']}) but a candidate run did not (a server on another machine, `qwen36 bench` "
                      "without --machine-speed, a live gate with --no-machine-speed): compared as recorded, "
                      "not rescaled to this day")
    probes = {s["probe"] for s in speeds}
    if probes != {base["probe"]}:
        return None, (f"the speed probes differ (baseline {base['probe']}, candidates {sorted(probes)}): "
                      "compared as recorded, not rescaled")
    kinds = {s.get("machine") for s in speeds}
    if base.get("machine") and kinds != {base["machine"]}:
        raise NotComparable(
            f"baseline {baseline.profile!r} was recorded on another kind of machine ({base['machine']}) than "
            f"this run's ({', '.join(sorted(map(str, kinds)))}): vLLM's CPU kernels and their speeds differ "
            f"between kinds in ways no single factor corrects. Record a profile on this kind "
            f"(`qwen36 baseline record --profile NAME`)")
    if base.get("busy") or any(s.get("busy") for s in speeds):
        return None, ("the machine was busy with other work while the speed probe ran (the probe would measure "
                      "that load, which the server mostly waits through): compared as recorded, not rescaled")
    rate = sum(s["rate"] for s in speeds) / len(speeds)
    factor = rate / base["rate"]
    if not 1 / MAX_FACTOR <= factor <= MAX_FACTOR:
        raise NotComparable(
            f"this machine ran the speed probe {base['probe']} at {rate:.4g} steps/s, {factor:.2f} times the "
            f"{base['rate']:.4g} of baseline {baseline.profile!r}'s machine: that is another machine, not another "
            f"day. Record a profile for it (`qwen36 baseline record --profile NAME`)")
    return factor, (f"machine speed: the probe ran at {rate:.4g} steps/s here, {base['rate']:.4g} when the baseline "
                    f"was recorded (x{factor:.3f}): the baseline's speeds are multiplied and its times divided by "
                    f"{factor:.3f} before comparing")


def rescaled(values: list[float], spec: Metric, factor: float | None) -> list[float]:
    """A baseline's values moved to a machine `factor` times as fast: times (s) divided, speeds (per second,
    and the score built of them) multiplied, counts and ratios as they are."""
    if factor is None:
        return values
    if spec.unit == "s":
        return [v / factor for v in values]
    if spec.unit in ("tok/s", "score"):
        return [v * factor for v in values]
    return values


def gate(
    baseline: Baseline,
    runs: Iterable[RunDir],
    scoring: Scoring,
    accept: Iterable[str] = (),
    point_map: dict[str, str] | None = None,
    family_alpha: float = FAMILY_ALPHA,
) -> GateReport:
    """Decide every (point, gated metric) pair. The false-alarm budget `family_alpha` is for the whole gate:
    each of the k checks tests at family_alpha / k (Bonferroni), so a gate of five metrics does not cry wolf
    five times as often as one."""
    runs = list(runs)
    if not runs:
        raise HarnessError("gate needs at least one run directory")
    accept = list(accept)
    accepted: list[str] = []
    for run in runs:
        actual = identity_from_manifest(run.manifest)
        diffs = identity_differences(baseline.identity, actual, accept=())
        refused = identity_differences(baseline.identity, actual, accept=accept)
        if refused:
            raise NotComparable(
                f"{run.path} is not comparable with baseline {baseline.profile!r}: " + "; ".join(refused)
                + ". Measure the same setup, or accept a named difference with --accept-difference FIELD"
            )
        accepted += [d for d in diffs if d not in accepted]
    candidate: dict[str, list[dict]] = {}
    for run in runs:
        for name, repeats in run.points.items():
            candidate.setdefault(name, []).extend(repeats)
    pairs, notes = _pair_points(baseline, candidate, point_map or {})
    factor, speed_note = speed_factor(baseline, runs)
    if speed_note:
        notes.append(speed_note)
    if baseline.imported:
        notes.append(f"baseline {baseline.profile!r} is imported ({baseline.recorded.get('note', 'single runs')}); "
                     "verdicts against it are conservative")
    checks = []
    for base_name, cand_name in pairs:
        for metric in baseline.gated_metrics(base_name):
            base_values = _numbers(baseline.points[base_name], metric, f"baseline {baseline.profile!r} {base_name}")
            cand_values = _numbers(candidate[cand_name], metric, f"candidate point {cand_name}")
            if not base_values or not cand_values:
                side = "baseline" if not base_values else "candidate"
                notes.append(f"{cand_name} {metric}: the {side} has no value; not gated")
                continue
            checks.append((base_name, cand_name, metric, base_values, cand_values))
    rows = []
    alpha = family_alpha / max(1, len(checks))  # Bonferroni over the checks made
    for base_name, cand_name, metric, base_values, cand_values in checks:
        spec = REGISTRY[metric]
        tolerance = baseline.tolerance(base_name, metric)
        decision = decide(rescaled(base_values, spec, factor), cand_values, spec.direction, tolerance, alpha=alpha)
        target = scoring.targets.get(metric)
        rows.append(GateRow(
            point=cand_name, metric=metric, unit=spec.unit, direction=spec.direction, tolerance=tolerance,
            decision=decision, target=f"{target.op} {target.value:g}" if target else None,
            target_met=target.met(decision.candidate) if target else None,
        ))
    return GateReport(baseline.profile, [str(r.path) for r in runs], rows, accepted, notes, family_alpha, factor)


def _fmt(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value:.2%}"
    return f"{value:.3g} {unit}" if abs(value) < 1000 else f"{value:,.1f} {unit}"


def report_markdown(report: GateReport) -> str:
    lines = [f"# Perf gate: baseline `{report.profile}`", "",
             f"Verdict: **{'PASS' if report.passed else 'REGRESSION'}** "
             f"({len(report.regressions)} regression(s) in {len(report.rows)} checks)", "",
             "| point | metric | baseline | candidate | change | tolerance | n (base/cand) | verdict | platform target |",
             "|---|---|---:|---:|---:|---:|---|---|---|"]
    for r in report.rows:
        d = r.decision
        change = f"{d.change:+.1%}" if r.tolerance.scale == "relative" else f"{d.change:+.3g}"
        verdict = d.verdict + (" (underpowered)" if d.underpowered and d.verdict == "pass" else "")
        target = "" if r.target is None else f"{r.target}: {'met' if r.target_met else 'not met'}"
        lines.append(f"| {r.point} | {r.metric} | {_fmt(d.baseline, r.unit)} | {_fmt(d.candidate, r.unit)} | "
                     f"{change} | {r.tolerance.describe()} | {d.n_baseline}/{d.n_candidate} | {verdict} | {target} |")
    notes = report.notes + [f"accepted difference: {d}" for d in report.accepted_differences]
    by_note: dict[str, list[str]] = {}
    for r in report.rows:
        if r.decision.note and r.metric not in by_note.setdefault(r.decision.note, []):
            by_note[r.decision.note].append(r.metric)
    notes += [f"{', '.join(metrics)}: {note}" for note, metrics in by_note.items()]
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    lines += ["", f"Rule: a regression is a worsening that is both significant (one-sided Welch t-test at "
              f"{report.family_alpha:g} / {max(1, len(report.rows))} checks, Bonferroni) and beyond the tolerance; "
              "a relative tolerance of 5% means 5% worse: candidate / baseline <= 0.95 where higher is better, "
              ">= 1.05 where lower is better; "
              "`underpowered` means the repeats cannot rule out a regression of the tolerance's size."]
    return "\n".join(lines) + "\n"


def write_report(report: GateReport, directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    md, js = directory / "gate.md", directory / "gate.json"
    md.write_text(report_markdown(report))
    js.write_text(json.dumps(report.as_dict(), indent=2, sort_keys=True) + "\n")
    return md, js
