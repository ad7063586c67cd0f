"""Baselines as files: `fixtures/baselines/<profile>.yaml`, every repeat's values per benchmark point.

    profile: cpu-tiny
    identity: {model, model_files_sha256, datasets: [[name, sha256]], server_args: [...], hardware: ...}
    recorded: {source: measured | imported, how: <command>, when: <ISO time>, commit: <git sha>, note: ...}
    tolerances: {metric: {value: 0.05, scale: relative | absolute}}   # what the gate allows
    noise: {point: {metric: cv}}                                      # measured spread, for the record
    points:
      <point name>:
        repeats: [{metric: value, ...}, ...]

Tolerances come from the gate policy (fixtures/gates/policy.yaml), raised where the recorded noise needs it
(`decision.min_tolerance`), so a baseline never promises more precision than its repeats can give.
"""
from __future__ import annotations

import difflib
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.errors import HarnessError
from harness.gates.decision import Tolerance, min_margin, min_tolerance
from harness.paths import BASELINES_DIR, GATE_POLICY_FILE


@dataclass
class Baseline:
    profile: str
    identity: dict
    recorded: dict
    tolerances: dict[str, Tolerance]
    points: dict[str, list[dict[str, float]]]  # point name -> repeats
    noise: dict = field(default_factory=dict)

    @property
    def imported(self) -> bool:
        return self.recorded.get("source") == "imported"

    def values(self, point: str, metric: str) -> list[float]:
        return [r[metric] for r in self.points.get(point, []) if r.get(metric) is not None]

    def to_yaml(self) -> str:
        doc = {
            "profile": self.profile,
            "identity": self.identity,
            "recorded": self.recorded,
            "tolerances": {m: {"value": t.value, "scale": t.scale} for m, t in self.tolerances.items()},
            "noise": self.noise,
            "points": {name: {"repeats": reps} for name, reps in self.points.items()},
        }
        return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)


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
        return Baseline(
            profile=doc["profile"],
            identity=doc.get("identity") or {},
            recorded=doc.get("recorded") or {},
            tolerances={m: Tolerance(float(t["value"]), t.get("scale", "relative"))
                        for m, t in (doc.get("tolerances") or {}).items()},
            points={name: list(p["repeats"]) for name, p in (doc.get("points") or {}).items()},
            noise=doc.get("noise") or {},
        )
    except (KeyError, TypeError, ValueError, yaml.YAMLError) as e:
        raise HarnessError(f"{path} is not a valid baseline ({type(e).__name__}: {e}); compare it with "
                           "fixtures/baselines/cpu-tiny.yaml") from e


def load_policy(path: Path = GATE_POLICY_FILE) -> dict[str, Tolerance]:
    """The gated metrics and their default tolerances."""
    doc = yaml.safe_load(Path(path).read_text())
    return {m: Tolerance(float(t["value"]), t.get("scale", "relative")) for m, t in doc["gated"].items()}


def coefficient_of_variation(values: list[float]) -> float | None:
    if len(values) < 2 or statistics.fmean(values) == 0:
        return None
    return statistics.stdev(values) / abs(statistics.fmean(values))


def tolerances_for(points: dict[str, list[dict]], policy: dict[str, Tolerance],
                   family_alpha: float = 0.05) -> tuple[dict[str, Tolerance], dict]:
    """Policy tolerances, raised to what the recorded noise can resolve at the gate's per-check alpha
    (family_alpha split over every point and metric); and the noise itself."""
    alpha = family_alpha / max(1, len(points) * len(policy))
    noise: dict = {}
    tolerances = dict(policy)
    for name, repeats in points.items():
        for metric, tol in policy.items():
            values = [r[metric] for r in repeats if r.get(metric) is not None]
            if tol.scale == "relative":
                cv = coefficient_of_variation(values)
                if cv is None:
                    continue
                noise.setdefault(name, {})[metric] = round(cv, 4)
                needed = min_tolerance(cv, len(values), len(values), alpha=alpha)
                if needed > tolerances[metric].value:
                    tolerances[metric] = Tolerance(round(needed, 4), "relative")
            elif len(values) >= 2:
                spread = statistics.stdev(values)
                noise.setdefault(name, {})[metric] = round(spread, 4)
                needed = min_margin(spread, len(values), len(values), alpha=alpha)
                if needed > tolerances[metric].value:
                    tolerances[metric] = Tolerance(round(needed, 4), "absolute")
    return tolerances, noise


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
