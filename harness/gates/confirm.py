"""A flagged paired verdict is measured again before it fails: the confirmation round.

Why: each paired gate splits a 5% false-alarm rate over its checks (harness.gates.paired), and CI runs two gates
that must pass (the A/A control and the slower commit), so by design up to one CI run in ten may go red on
identical servers. One did (ci17: the commit gate read weighted throughput -12.2% against a 10.2% tolerance on a
commit that changed nothing the CPU server runs). PyTorch's HUD waits for two consecutive violating points before
it flags a regression; this is the same idea inside one run.

The rule: when the first look (one interleaved measurement) flags a regression and has no insufficient check,
the two arms are measured again, another `rounds` rounds of the flagged points only, and the pairs of both
measurements are pooled (paired_gate over both runs). A check fails only if the first look AND the pooled pairs
flag it. A false alarm then needs the pooled mean to stay beyond the tolerance, so the rate can only fall below
the first look's; a real regression keeps its mean in the second round, so it stays caught. On the calibration's
runs (`qwen36 calibrate --analyse`, "two looks") every first-look catch at sizes 0.2 and 0.3 held when pooled
with a second run. An insufficient check fails at once: no second round makes a value from too few requests
trustworthy.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from harness.bench.run import Workload
from harness.gates.interleave import Arm, interleave
from harness.gates.paired import PairedReport, PairedRow, PairedTolerances, paired_gate, report_markdown


@dataclass
class ConfirmedVerdict:
    """A first look and, where it flagged a regression, the pooled verdict of it and its confirmation round."""
    first: PairedReport
    pooled: PairedReport | None = None  # None: the first look needed no confirmation (or has not had it yet)

    @property
    def needs_confirmation(self) -> bool:
        return bool(self.first.regressions) and not self.first.insufficient and self.pooled is None

    @property
    def regressions(self) -> list[PairedRow]:
        """The checks flagged by the first look and by the pooled pairs."""
        if self.pooled is None:
            return self.first.regressions
        first = {(r.point, r.metric) for r in self.first.regressions}
        return [r for r in self.pooled.regressions if (r.point, r.metric) in first]

    @property
    def insufficient(self) -> list[PairedRow]:
        return self.first.insufficient + (self.pooled.insufficient if self.pooled else [])

    @property
    def passed(self) -> bool:
        return not self.regressions and not self.insufficient

    def markdown(self) -> str:
        if self.pooled is None:
            return report_markdown(self.first)
        held = ", ".join(f"{r.point} {r.metric}" for r in self.regressions) or "none"
        return (f"First look:\n\n{report_markdown(self.first)}\nConfirmation (the first look's pairs pooled with "
                f"a second round of the flagged points):\n\n{report_markdown(self.pooled)}\n"
                f"Confirmed regressions (flagged by both): {held}. Verdict: **{'PASS' if self.passed else 'FAIL'}**\n")


def flagged_points(report: PairedReport) -> set[str]:
    return {r.point for r in report.regressions}


def only_points(workloads: tuple[Workload, ...], points: set[str]) -> tuple[Workload, ...]:
    """`workloads` cut down to the points named (`dataset@cN`, as harness.bench.run names them)."""
    kept = []
    for w in workloads:
        concurrencies = tuple(c for c in w.concurrencies if f"{w.dataset}@c{c}" in points)
        if concurrencies:
            kept.append(dataclasses.replace(w, concurrencies=concurrencies))
    return tuple(kept)


def confirm(first: PairedReport, arms: dict[str, Arm], workloads: tuple[Workload, ...], rounds: int, out_root: Path,
            tolerances: PairedTolerances | None = None, show_progress: bool = False, **interleave_args) -> ConfirmedVerdict:
    """`first` as a ConfirmedVerdict: measured again and pooled where it flagged a regression (the module's rule).
    `arms` maps the first look's two labels to their arms, servers still up."""
    verdict = ConfirmedVerdict(first)
    if not verdict.needs_confirmation:
        return verdict
    a, b = first.labels["a"], first.labels["b"]
    label = f"confirm-{b}-against-{a}"
    second = interleave([arms[a], arms[b]], only_points(workloads, flagged_points(first)), rounds, out_root, label,
                        show_progress=show_progress, **interleave_args)
    verdict.pooled = paired_gate([Path(first.path), second.path], a, b, tolerances, family_alpha=first.family_alpha)
    return verdict
