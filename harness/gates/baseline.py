"""Baselines as files: `fixtures/baselines/<profile>.yaml`, every repeat's values per benchmark point.

    profile: cpu-tiny
    identity: {model, model_files_sha256, datasets: [[name, sha256]], server_args: [...], hardware: ...,
               workload: {preset: gate, description: ...}}                  # preset: required, a bench preset
    recorded: {source: measured | imported, how: <command>, when: <ISO time>, commit: <git sha>, note: ...}
    machine_speed: {probe, unit, rate, machine, busy}                 # optional: harness.machine.speed
    tolerance_floor: 0.08                                             # optional, relative metrics only
    tolerances: {metric: {value: 0.05, scale: relative | absolute}}   # default for a point without its own
    noise: {point: {metric: cv}}                                      # measured spread, for the record
    points:
      <point name>:
        tolerances: {metric: {value: 0.05, scale: relative}}          # what the gate allows at this point
        notes: {metric: "CV 0.21 over 5 repeats needs 31% ..."}       # why a tolerance is above 15%
        repeats: [{metric: value, ...}, ...]

A point's tolerance is the smallest that catches a worsening of twice it 9 times in 10 with the candidate
repeats the gate will run (recorded.tolerances_sized_for) at the gate's per-check alpha; the notes say so.

Tolerances come from the gate policy (fixtures/gates/policy.yaml), raised per point where that point's recorded
noise needs it (`decision.min_tolerance`), so a baseline never promises more precision than its repeats can
give, and a quiet point is not gated at a noisy point's tolerance. `tolerance_floor` is a profile's documented
minimum relative tolerance: drift between machines or server starts, which repeats within one run cannot show.
An imported baseline (single runs) has only the top-level `tolerances`, which every point then uses.
"""
from __future__ import annotations

import difflib
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.errors import HarnessError
from harness.gates.decision import Tolerance, min_margin, min_tolerance
from harness.bench.metrics import REGISTRY, check_declared
from harness.paths import BASELINES_DIR, GATE_POLICY_FILE

# A tolerance raised above this gets a note in the file saying which noise needed it.
NOTE_ABOVE = 0.15


@dataclass
class Baseline:
    profile: str
    identity: dict
    recorded: dict
    tolerances: dict[str, Tolerance]  # the default, for a point without its own (an imported baseline's only)
    points: dict[str, list[dict[str, float]]]  # point name -> repeats
    noise: dict = field(default_factory=dict)
    point_tolerances: dict[str, dict[str, Tolerance]] = field(default_factory=dict)
    notes: dict[str, dict[str, str]] = field(default_factory=dict)  # point -> metric -> why it was raised
    tolerance_floor: float | None = None
    # harness.machine.speed's probe on the recording machine then: the gate rescales to a candidate's day by it.
    machine_speed: dict | None = None

    @property
    def imported(self) -> bool:
        return self.recorded.get("source") == "imported"

    @property
    def workload_preset(self) -> str | None:
        workload = self.identity.get("workload")
        return workload.get("preset") if isinstance(workload, dict) else None

    def values(self, point: str, metric: str) -> list[float]:
        return [r[metric] for r in self.points.get(point, []) if r.get(metric) is not None]

    def gated_metrics(self, point: str) -> list[str]:
        """The metrics with a tolerance at this point: its own, then the defaults it does not override."""
        own = self.point_tolerances.get(point, {})
        return list(own) + [m for m in self.tolerances if m not in own]

    def tolerance(self, point: str, metric: str) -> Tolerance:
        """What the gate allows for this metric at this point (the point's own, else the default), never
        below the profile's floor for a relative metric."""
        tol = self.point_tolerances.get(point, {}).get(metric) or self.tolerances.get(metric)
        if tol is None:
            raise HarnessError(f"baseline {self.profile!r} has no tolerance for {metric} at point {point!r}; "
                               "add it to the point's tolerances (or the top-level default) or record again")
        if self.tolerance_floor and tol.scale == "relative" and tol.value < self.tolerance_floor:
            return Tolerance(self.tolerance_floor, "relative")
        return tol

    def to_yaml(self) -> str:
        doc = {"profile": self.profile, "identity": self.identity, "recorded": self.recorded}
        if self.machine_speed is not None:
            doc["machine_speed"] = self.machine_speed
        if self.tolerance_floor is not None:
            doc["tolerance_floor"] = self.tolerance_floor
        doc["tolerances"] = _tolerances_doc(self.tolerances)
        doc["noise"] = self.noise
        doc["points"] = {name: self._point_doc(name, reps) for name, reps in self.points.items()}
        return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=110)

    def _point_doc(self, name: str, repeats: list[dict]) -> dict:
        out: dict = {}
        if self.point_tolerances.get(name):
            out["tolerances"] = _tolerances_doc(self.point_tolerances[name])
        if self.notes.get(name):
            out["notes"] = _Block(self.notes[name])
        out["repeats"] = repeats
        return out


class _Block(dict):
    """A mapping written one key per line (sentences do not fit a flow mapping)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Block, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data, flow_style=False))


def _tolerances_doc(tolerances: dict[str, Tolerance]) -> dict:
    return {m: {"value": t.value, "scale": t.scale} for m, t in tolerances.items()}


def _tolerances(doc: dict | None) -> dict[str, Tolerance]:
    return {m: Tolerance(float(t["value"]), t.get("scale", "relative")) for m, t in (doc or {}).items()}


def _machine_speed(doc) -> dict | None:
    if doc is None:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("probe"), str) or float(doc["rate"]) <= 0:
        raise ValueError(f"machine_speed {doc!r} needs a probe name and a positive rate")
    return doc


def baseline_path(profile: str, root: Path = BASELINES_DIR) -> Path:
    if not profile or "/" in profile or profile.startswith("."):
        raise HarnessError(f"baseline profile {profile!r} is not a plain name such as cpu-tiny")
    return Path(root) / f"{profile}.yaml"


def load_baseline(profile: str, root: Path = BASELINES_DIR) -> Baseline:
    path = baseline_path(profile, root)
    if not path.exists():
        known = sorted(p.stem for p in Path(root).glob("*.yaml"))
        raise HarnessError(f"no baseline {path}; known profiles: {', '.join(known) or 'none'} "
                           f"(record one with `qwen36 baseline record --profile {profile}`)")
    try:
        doc = yaml.safe_load(path.read_text())
        points = doc.get("points") or {}
        floor = doc.get("tolerance_floor")
        baseline = Baseline(
            profile=doc["profile"],
            identity=doc.get("identity") or {},
            recorded=doc.get("recorded") or {},
            tolerances=_tolerances(doc.get("tolerances")),
            points={name: list(p["repeats"]) for name, p in points.items()},
            noise=doc.get("noise") or {},
            point_tolerances={name: _tolerances(p.get("tolerances")) for name, p in points.items()
                              if p.get("tolerances")},
            notes={name: dict(p["notes"]) for name, p in points.items() if p.get("notes")},
            tolerance_floor=None if floor is None else float(floor),
            machine_speed=_machine_speed(doc.get("machine_speed")),
        )
    except (AttributeError, KeyError, TypeError, ValueError, yaml.YAMLError) as e:
        raise HarnessError(f"{path} is not a valid baseline ({type(e).__name__}: {e}); compare it with "
                           "fixtures/baselines/cpu-tiny.yaml") from e
    _check(baseline, path)
    return baseline


def _check(baseline: Baseline, path: Path) -> None:
    """What the gate would otherwise trip over later: named here with the fix."""
    preset = baseline.workload_preset
    from harness.bench.run import PRESETS  # lazily: the bench pulls in the client and the server launcher

    if not isinstance(preset, str) or preset not in PRESETS:
        raise HarnessError(
            f"baseline {baseline.profile!r} ({path}): identity.workload.preset is {preset!r}, not a bench preset; "
            f"write `workload: {{preset: NAME, description: ...}}` with NAME one of {', '.join(PRESETS)} "
            "(add a preset to harness/bench/run.py PRESETS if none measures this workload)")
    floor = baseline.tolerance_floor
    if floor is not None and not 0 < floor < 1:
        raise HarnessError(f"baseline {baseline.profile!r} ({path}): tolerance_floor {floor} must be a fraction "
                           "between 0 and 1 (0.08 for 8%)")
    for point in baseline.points:
        # A point may lack a gated metric (not measured there), never hold one the declarations do not gate.
        check_declared(baseline.gated_metrics(point), "gates",
                       f"baseline {baseline.profile!r} ({path}), point {point!r} tolerances", complete=False)
        for metric in baseline.gated_metrics(point):
            try:
                baseline.tolerance(point, metric).margin(REGISTRY[metric].direction)
            except ValueError as e:
                raise HarnessError(f"baseline {baseline.profile!r} ({path}), point {point!r}, {metric}: {e}") from e


def load_policy(path: Path = GATE_POLICY_FILE) -> dict[str, Tolerance]:
    """The default tolerance of each metric harness/bench/metrics.py declares for `gates` (the file must give one
    for each of them, and for no other)."""
    doc = yaml.safe_load(Path(path).read_text())
    policy = _tolerances(doc["gated"])
    check_declared(policy, "gates", f"gate policy {path}, gated")
    return policy


def coefficient_of_variation(values: list[float]) -> float | None:
    if len(values) < 2 or statistics.fmean(values) == 0:
        return None
    return statistics.stdev(values) / abs(statistics.fmean(values))


def with_floor(policy: dict[str, Tolerance], floor: float | None) -> dict[str, Tolerance]:
    """The policy with relative tolerances raised to the profile's floor."""
    if not floor:
        return dict(policy)
    return {m: Tolerance(max(t.value, floor), t.scale) if t.scale == "relative" else t for m, t in policy.items()}


def tolerances_for(points: dict[str, list[dict]], policy: dict[str, Tolerance], family_alpha: float = 0.05,
                   floor: float | None = None, candidate_repeats: int | None = None,
                   ) -> tuple[dict[str, dict[str, Tolerance]], dict, dict[str, dict[str, str]]]:
    """Per point and metric: max(policy, floor (relative only), what that point's recorded noise can resolve
    at the gate's per-check alpha), with family_alpha split over every point and metric. The noise is sized
    for a gate of `candidate_repeats` candidate repeats (default: as many as the baseline has), since fewer
    candidate repeats resolve less. Returns (tolerances, noise, notes on tolerances raised above 15%)."""
    alpha = family_alpha / max(1, len(points) * len(policy))
    base = with_floor(policy, floor)
    tolerances: dict[str, dict[str, Tolerance]] = {}
    noise: dict = {}
    notes: dict[str, dict[str, str]] = {}
    for name, repeats in points.items():
        for metric, tol in base.items():
            values = [r[metric] for r in repeats if r.get(metric) is not None]
            if not values:
                continue  # not measured at this point: not gated there
            n_b = len(values)
            n_c = candidate_repeats or n_b
            tolerances.setdefault(name, {})[metric] = tol
            if n_b < 2:
                continue  # a single run has no spread to size a tolerance from
            if tol.scale == "relative":
                spread = coefficient_of_variation(values)
                if spread is None:
                    continue
                needed = min_tolerance(spread, n_b, n_c, alpha=alpha, direction=REGISTRY[metric].direction)
                what = f"CV {spread:.2f}"
            else:
                spread = statistics.stdev(values)
                needed = min_margin(spread, n_b, n_c, alpha=alpha)
                what = f"spread {spread:.3g}"
            noise.setdefault(name, {})[metric] = round(spread, 4)
            if needed > tol.value:
                raised = Tolerance(math.ceil(needed * 1e4) / 1e4, tol.scale)  # rounded up: never below the need
                tolerances[name][metric] = raised
                if raised.value > NOTE_ABOVE:
                    notes.setdefault(name, {})[metric] = (
                        f"{what} over {n_b} repeats needs {raised.describe()} ({n_c} candidate repeats, "
                        f"alpha {alpha:.2g})")
    return tolerances, noise, notes


def save_baseline(baseline: Baseline, root: Path = BASELINES_DIR, update: bool = False) -> str:
    """Write the baseline; an existing file is replaced only with `update`, and the diff is returned."""
    path = baseline_path(baseline.profile, root)
    new = baseline.to_yaml()
    old = path.read_text() if path.exists() else ""
    if old and not update:
        raise HarnessError(f"{path} exists; pass --update to replace it (the diff is printed)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(path), str(path)))
