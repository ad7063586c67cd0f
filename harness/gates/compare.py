"""A/B comparison of two run directories, point by point (the InfiniLM report's method, docs/design.md).

For each point both runs measured: the ratio B / A of each metric's median over repeats, and per metric the
geometric mean of the ratios across points. A point that failed in A (no successful request) but succeeded
in B is "capacity gained", listed apart and kept out of the means: it is not a speed-up. The reverse is
"capacity lost". The metrics compared are those harness/bench/metrics.py declares for `compare`, in its order.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable

from harness.gates.gate import NotComparable, RunDir
from harness.gates.identity import identity_differences, identity_from_manifest
from harness.bench.metrics import REGISTRY, shown_in

COMPARED = shown_in("compare")


@dataclass
class Comparison:
    run_a: str
    run_b: str
    ratios: dict[str, dict[str, float]]  # point -> metric -> B / A
    geomean: dict[str, float]  # metric -> geometric mean over points
    capacity_gained: list[str] = field(default_factory=list)
    capacity_lost: list[str] = field(default_factory=list)
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    accepted_differences: list[str] = field(default_factory=list)


def _median(repeats: list[dict], metric: str) -> float | None:
    values = [r[metric] for r in repeats if r.get(metric) is not None]
    return statistics.median(values) if values else None


def _succeeded(repeats: list[dict]) -> bool:
    rate = _median(repeats, "success_rate")
    return rate is not None and rate > 0


def compare_runs(a: RunDir, b: RunDir, accept: Iterable[str] = (), metrics=COMPARED) -> Comparison:
    ident_a, ident_b = identity_from_manifest(a.manifest), identity_from_manifest(b.manifest)
    refused = identity_differences(ident_a, ident_b, accept=accept)
    if refused:
        raise NotComparable(f"{a.path} and {b.path} did not measure the same thing: " + "; ".join(refused)
                            + ". Accept a named difference with --accept-difference FIELD")
    result = Comparison(str(a.path), str(b.path), {}, {},
                        accepted_differences=identity_differences(ident_a, ident_b))
    result.only_in_a = sorted(set(a.points) - set(b.points))
    result.only_in_b = sorted(set(b.points) - set(a.points))
    for point in sorted(set(a.points) & set(b.points)):
        ok_a, ok_b = _succeeded(a.points[point]), _succeeded(b.points[point])
        if not ok_a and ok_b:
            result.capacity_gained.append(point)
            continue
        if ok_a and not ok_b:
            result.capacity_lost.append(point)
            continue
        if not ok_a:
            continue
        ratios = {}
        for metric in metrics:
            va, vb = _median(a.points[point], metric), _median(b.points[point], metric)
            if va and vb is not None and va > 0 and vb > 0:
                ratios[metric] = vb / va
        result.ratios[point] = ratios
    for metric in metrics:
        values = [r[metric] for r in result.ratios.values() if metric in r]
        if values:
            result.geomean[metric] = math.exp(statistics.fmean(math.log(v) for v in values))
    return result


def comparison_markdown(c: Comparison) -> str:
    metrics = [m for m in COMPARED if m in c.geomean]
    lines = ["# A/B comparison", "", f"- A: `{c.run_a}`", f"- B: `{c.run_b}`", "",
             "Ratios B / A of each metric's median over repeats; "
             + ", ".join(f"{m} ({'higher' if REGISTRY[m].direction == 'higher' else 'lower'} is better)" for m in metrics),
             "", "| point | " + " | ".join(metrics) + " |", "|---|" + "---:|" * len(metrics)]
    for point, ratios in c.ratios.items():
        lines.append(f"| {point} | " + " | ".join(f"{ratios[m]:.3f}" if m in ratios else "" for m in metrics) + " |")
    lines.append("| **geometric mean** | " + " | ".join(f"**{c.geomean[m]:.3f}**" for m in metrics) + " |")
    extra = [("capacity gained (failed in A, succeeded in B; not counted as speed-up)", c.capacity_gained),
             ("capacity lost (succeeded in A, failed in B)", c.capacity_lost),
             ("only in A", c.only_in_a), ("only in B", c.only_in_b),
             ("accepted differences", c.accepted_differences)]
    for title, items in extra:
        if items:
            lines += ["", f"{title}:"] + [f"- {i}" for i in items]
    return "\n".join(lines) + "\n"
