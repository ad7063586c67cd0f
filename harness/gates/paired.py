"""The paired verdict: two servers measured in one run, in alternating blocks (harness.gates.interleave).

Why paired: CI lands on machines of several kinds, about 4x apart in speed, whose speed also drifts by tens of
percent within a run. A recorded baseline cannot tell a slower machine from a slower server; two servers
measured side by side on the same machine, block by block, can. flash-linear-attention's benchmark CI (origin/main
against HEAD on one runner) and `asv continuous` decide the same way.

Per (point, gated metric), side A is the reference (the session's server, or the performance reference commit's)
and side B the candidate. Each pair i gives d_i, how much worse B is than A in the metric's direction: the log
ratio for a relative tolerance, the difference for an absolute one (rates, in points). With n pairs, mean d and
spread s:

- `regression` needs BOTH: the worsening is significant (one-sided paired t-test, t = d / (s / sqrt(n)) on n - 1
  degrees of freedom, p < alpha, the gate's 5% split over its checks as harness.gates.gate does) AND the mean is
  beyond the tolerance (d > m, m as harness.gates.decision's `Tolerance.margin`). `improvement` is the mirror;
  otherwise `pass`, marked `underpowered` where the pairs cannot rule out a worsening of the tolerance's size.
- The tolerance is what separately started identical servers differ by on this kind of machine: sized from A/A
  pairs (fixtures/gates/paired.yaml says from which), not from the within-run spread, which the t-test already
  accounts for.
- A timing percentile computed from fewer than half of a block's requests (the rest failed, or stalled on the
  client's side and were left out) is `insufficient`: reported as such, and never a pass.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml
from scipy import special

from harness.errors import HarnessError
from harness.gates.baseline import load_policy
from harness.gates.decision import Decision, Direction, Tolerance, t_verdict
from harness.gates.gate import FAMILY_ALPHA, load_run
from harness.bench.metrics import REGISTRY, TIMING_PERCENTILES
from harness.paths import PAIRED_TOLERANCES_FILE


DEFAULT_PAIRS = 8
# The per-request timing percentiles: computed from the block's timed requests only.
_TIMED = {m.name for family in TIMING_PERCENTILES for m in family.metrics()}


def pair_differences(a: list[float], b: list[float], direction: Direction, scale: str) -> list[float]:
    """d_i per pair: how much worse b_i is than a_i in the metric's direction (positive = worse), as a log ratio
    for a relative tolerance, as a difference for an absolute one."""
    if len(a) != len(b):
        raise ValueError(f"paired values need one a per b: {len(a)} a, {len(b)} b")
    if scale == "relative" and any(v <= 0 for v in (*a, *b)):
        raise ValueError(f"a relative tolerance compares ratios, and a value is <= 0 (a={a}, b={b})")
    t = math.log if scale == "relative" else (lambda v: v)
    sign = 1.0 if direction == "lower" else -1.0
    return [sign * (t(y) - t(x)) for x, y in zip(a, b)]


def decide_paired(a: list[float], b: list[float], direction: Direction, tolerance: Tolerance,
                  alpha: float = 0.05) -> Decision:
    """The verdict on pairs (a_i, b_i), b the candidate; see the module docstring."""
    d = pair_differences(a, b, direction, tolerance.scale)
    centre = (lambda v: math.exp(statistics.fmean(map(math.log, v)))) if tolerance.scale == "relative" \
        else statistics.fmean
    ca, cb = centre(a), centre(b)
    change = cb / ca - 1 if tolerance.scale == "relative" else cb - ca
    verdict, p_worse, underpowered, note = decide_differences(d, tolerance.margin(direction), alpha)
    return Decision(verdict, baseline=ca, candidate=cb, change=change, worse_by=statistics.fmean(d), p_worse=p_worse,
                    n_baseline=len(d), n_candidate=len(d), underpowered=underpowered, note=note)


def decide_differences(d: list[float], margin: float, alpha: float) -> tuple[str, float, bool, str]:
    """(verdict, one-sided p that b is worse, underpowered, note) for pair differences `d` (positive = worse) at
    `margin` on the comparison scale: the rule of the module docstring."""
    if len(d) < 2:
        raise ValueError(f"{len(d)} pair(s): a paired verdict needs at least 2 (the spread of their ratios)")
    n, mean, s = len(d), statistics.fmean(d), statistics.stdev(d)
    if s == 0:
        verdict = "regression" if mean > margin else "improvement" if -mean > margin else "pass"
        return verdict, 0.0 if mean > 0 else 1.0, False, "every pair differs by the same amount: the difference is exact"
    verdict, p_worse, underpowered = t_verdict(mean, s / math.sqrt(n), n - 1, margin, alpha)
    return verdict, p_worse, underpowered, ""


def margin_from_controls(control_means: list[float], alpha: float) -> float:
    """The margin (comparison scale) that A/A controls would exceed with probability about `alpha`: each control
    is the mean pair difference of two separately started identical servers, so their spread holds both the
    start-to-start offset and the sampling error of a mean over the gate's pairs. The spread is taken around 0
    (a systematic offset of the twin counts against it), and widened as a prediction for one more control:
    t(1 - alpha, K - 1) * rms * sqrt(1 + 1/K) over K controls."""
    k = len(control_means)
    if k < 3:
        raise ValueError(f"{k} A/A control(s): size a tolerance from 3 or more")
    rms = math.sqrt(math.fsum(m * m for m in control_means) / k)
    return _prediction_margin(rms, k, alpha)


def _prediction_margin(spread: float, k: int, alpha: float) -> float:
    return float(special.stdtrit(k - 1, 1 - alpha)) * spread * math.sqrt(1 + 1 / k)


# The start-to-start offset rests on the controls' few server starts (10 in the calibration), so a tolerance is sized
# with its OFFSET_BOUND upper confidence bound, bootstrapped over the starts. Simulated with the offset at its 90%
# bound, a CI run on the noisiest kind fails 4.3% of the time with tolerances sized at the estimate, 3.7% at the 80%
# bound (docs/gate-simulation.md; tools/offset_bound_tradeoff.py).
OFFSET_BOUND = 0.8
_RESAMPLES = 2000


@dataclass(frozen=True)
class ControlSpread:
    """What A/A controls' mean pair differences are made of: a start-to-start offset, which more pairs cannot average
    out, and the pairs' own spread, which they can (a mean over n pairs holds pair_sd / sqrt(n) of it)."""
    offset_sd: float  # the estimate
    pair_sd: float
    controls: int
    offset_bound: float  # the offset a tolerance is sized with: its upper confidence bound where starts are known

    def mean_sd(self, pairs: int) -> float:
        """The spread of one control's mean over `pairs` pairs, the offset at its bound."""
        return math.hypot(self.offset_bound, self.pair_sd / math.sqrt(pairs))


def control_spread(controls: list[list[float]], starts: Sequence | None = None,
                   bound: float = OFFSET_BOUND) -> ControlSpread:
    """Split the controls' mean-square mean into the offset's part and the pairs' part (method of moments): the
    pairs' part of a control's mean square is its pairs' variance over their count; the rest is the offset's, taken
    as 0 where the pairs explain it all. `starts` (one label per control: the server start it measured) gives the
    offset its `bound` upper confidence bound, by resampling whole starts (seeded: the same controls size the same
    tolerance); without them the bound is the estimate."""
    kept = [(d, s) for d, s in zip(controls, starts if starts is not None else [None] * len(controls)) if len(d) >= 2]
    if len(kept) < 3:
        raise ValueError(f"{len(kept)} A/A control(s) of 2 or more pairs: size a tolerance from 3 or more")
    square = np.array([statistics.fmean(d) ** 2 for d, _ in kept])
    sampling = np.array([statistics.variance(d) / len(d) for d, _ in kept])
    pair_var = float(np.mean([statistics.variance(d) for d, _ in kept]))
    offset = math.sqrt(max(0.0, float(square.mean() - sampling.mean())))
    labels = [s for _, s in kept]
    bounded = offset
    if starts is not None and len(set(labels)) >= 3:
        bounded = max(offset, _offset_bound(square - sampling, labels, bound))
    return ControlSpread(offset, math.sqrt(pair_var), len(kept), bounded)


def _offset_bound(offset_parts: np.ndarray, labels: list, bound: float) -> float:
    """The `bound` quantile of the offset estimate over resamples of whole starts (each control's part of the offset
    variance, its mean square less its sampling part, drawn with its start)."""
    groups = {g: i for i, g in enumerate(sorted(set(labels), key=str))}
    member = np.zeros((len(groups), len(labels)))  # start x control
    member[[groups[s] for s in labels], np.arange(len(labels))] = 1.0
    picks = np.random.default_rng(0).integers(0, len(groups), (_RESAMPLES, len(groups)))
    drawn = np.zeros((_RESAMPLES, len(groups)))
    np.add.at(drawn, (np.arange(_RESAMPLES)[:, None], picks), 1.0)
    per_control = drawn @ member  # how often each control is drawn, per resample
    offsets = np.sqrt(np.maximum(0.0, (per_control @ offset_parts) / per_control.sum(axis=1)))
    return float(np.quantile(offsets, bound))


def margin_for_pairs(controls: list[list[float]], alpha: float, pairs: int, starts: Sequence | None = None,
                     bound: float = OFFSET_BOUND) -> float:
    """margin_from_controls for a gate of `pairs` pairs, from controls of any number of pairs: the controls' spread
    split by control_spread and put together again at `pairs`. Controls of the gate's own size give about what
    margin_from_controls gives; shorter ones no longer size a wider tolerance than the gate needs (the
    calibration's 8-pair controls sized 11.0% on Output TPS P10: their spread was the 8-pair mean's sampling error,
    half of which 16 pairs average out). `starts`, `bound`: see control_spread."""
    spread = control_spread(controls, starts, bound)
    return _prediction_margin(spread.mean_sd(pairs), spread.controls, alpha)


@dataclass
class PairedRow:
    point: str
    metric: str
    unit: str
    direction: str
    tolerance: Tolerance
    decision: Decision | None  # None when insufficient
    insufficient: list[str] = field(default_factory=list)  # why: the blocks whose value cannot be trusted
    differences: list[float] = field(default_factory=list)  # d_i per pair (pair_differences), in pair order

    @property
    def spread(self) -> float | None:
        """The standard deviation of d_i over the pairs."""
        return statistics.stdev(self.differences) if len(self.differences) >= 2 else None

    @property
    def verdict(self) -> str:
        return "insufficient" if self.insufficient else self.decision.verdict

    def as_dict(self) -> dict:
        return {"point": self.point, "metric": self.metric, "unit": self.unit, "direction": self.direction,
                "tolerance": asdict(self.tolerance), "verdict": self.verdict,
                "decision": asdict(self.decision) if self.decision else None, "insufficient": self.insufficient,
                "differences": self.differences}


@dataclass
class PairedReport:
    path: str
    labels: dict[str, str]  # "a"/"b" -> side label
    pairs: int
    rows: list[PairedRow]
    excluded: dict[str, dict[str, list[int]]]  # point -> side -> requests left out of the timing, per block
    notes: list[str] = field(default_factory=list)
    family_alpha: float = FAMILY_ALPHA

    @property
    def regressions(self) -> list[PairedRow]:
        return [r for r in self.rows if r.verdict == "regression"]

    @property
    def insufficient(self) -> list[PairedRow]:
        return [r for r in self.rows if r.verdict == "insufficient"]

    @property
    def passed(self) -> bool:
        return not self.regressions and not self.insufficient

    def row(self, point: str, metric: str) -> PairedRow:
        for r in self.rows:
            if r.point == point and r.metric == metric:
                return r
        raise KeyError(f"no check of {metric} at {point}; the report has "
                       f"{sorted((r.point, r.metric) for r in self.rows)}")

    def as_dict(self) -> dict:
        return {"path": self.path, "labels": self.labels, "pairs": self.pairs, "passed": self.passed,
                "family_alpha": self.family_alpha, "excluded": self.excluded, "notes": self.notes,
                "rows": [r.as_dict() for r in self.rows]}


@dataclass(frozen=True)
class PairedTolerances:
    """Per point and metric, what separately started identical servers differ by (fixtures/gates/paired.yaml);
    a pair not listed takes fixtures/gates/policy.yaml's tolerance."""
    points: dict[str, dict[str, Tolerance]]
    measured: dict  # how and where the A/A pairs behind them were measured
    pairs: int = DEFAULT_PAIRS  # the pairs a gate measures, what the tolerances were sized with

    @classmethod
    def load(cls, path: Path = PAIRED_TOLERANCES_FILE) -> "PairedTolerances":
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
            points = {p: {m: Tolerance(float(t["value"]), t.get("scale", "relative")) for m, t in metrics.items()}
                      for p, metrics in (raw.get("points") or {}).items()}
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
            raise HarnessError(f"paired tolerances {path}: {exc!r}; it needs points.<point>.<metric>: "
                               "{value, scale}") from exc
        return cls(points, raw.get("measured") or {}, int(raw.get("pairs") or DEFAULT_PAIRS))

    def tolerance(self, point: str, metric: str) -> Tolerance:
        found = self.points.get(point, {}).get(metric)
        return found if found is not None else load_policy()[metric]

    def floor(self, point: str, metric: str) -> Tolerance:
        """The least a sized tolerance may be: fixtures/gates/policy.yaml's, the smallest change that matters."""
        return load_policy()[metric]

    def checks(self, point: str) -> tuple[str, ...]:
        """The metrics gated at `point`: the file's for a point it lists, else every metric of the policy."""
        return tuple(self.points[point]) if point in self.points else tuple(load_policy())


def paired_gate(run_path: Path | Sequence[Path], a: str, b: str, tolerances: PairedTolerances | None = None,
                metrics: dict[str, tuple[str, ...]] | None = None, family_alpha: float = FAMILY_ALPHA) -> PairedReport:
    """Decide every (point, gated metric) of an interleaved run (harness.gates.interleave), or only `metrics`
    (point -> metric names): arm `b` (the candidate) against arm `a` (the reference), pair by pair. Given several
    runs of the same arms (a first look and its confirmation, harness.gates.confirm), their pairs are pooled,
    numbered on from one run to the next; a point one run lacks takes the pairs of the others."""
    paths = [Path(run_path)] if isinstance(run_path, (str, Path)) else [Path(p) for p in run_path]
    tolerances = tolerances or PairedTolerances.load()
    points: dict[str, list[tuple[dict, dict, int]]] = {}
    notes, excluded, rounds = [], {}, 0
    for path in paths:
        meta = _rounds_meta(path, (a, b))
        arms = {"a": load_run(path / a).points, "b": load_run(path / b).points}
        for point in meta["points"]:
            if metrics is not None and point not in metrics:
                continue
            blocks = {w: {r["repeat"]: r for r in arms[w].get(point, [])} for w in arms}
            paired = sorted(set(blocks["a"]) & set(blocks["b"]))
            points.setdefault(point, []).extend((blocks["a"][i], blocks["b"][i], rounds + i) for i in paired)
            for w in arms:
                excluded.setdefault(point, {"a": [], "b": []})[w] += [blocks[w][i].get("stalled_excluded", 0)
                                                                      for i in paired]
        if meta.get("end_reason") != "completed":
            notes.append(f"the measurement {path.name} ended early: {meta.get('end_reason')}")
        rounds += meta["rounds"]
    checks = [(point, metric, pairs) for point, pairs in points.items()
              for metric in (metrics or {}).get(point, tolerances.checks(point))]
    alpha = family_alpha / max(1, len(checks))
    rows = [_row(point, metric, pairs, tolerances.tolerance(point, metric), alpha)
            for point, metric, pairs in checks]
    return PairedReport(str(paths[0]), {"a": a, "b": b}, rounds, rows, excluded, notes, family_alpha)


def _rounds_meta(run_path: Path, arms: tuple[str, ...]) -> dict:
    """An interleaved run's rounds.json, refused where it is not one or lacks one of `arms`."""
    try:
        meta = json.loads((run_path / "rounds.json").read_text())
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{run_path} is not an interleaved run ({exc}); make one with `qwen36 ab`") from exc
    for arm in arms:
        if arm not in meta["arms"]:
            raise HarnessError(f"{run_path} has no arm {arm!r}; its arms: {', '.join(meta['arms'])}")
    return meta


def _row(point: str, metric: str, pairs: list[tuple[dict, dict, int]], tolerance: Tolerance,
         alpha: float) -> PairedRow:
    spec = REGISTRY[metric]
    row = PairedRow(point, metric, spec.unit, spec.direction, tolerance, None)
    a, b = [], []
    for block_a, block_b, i in pairs:
        for side, block in (("a", block_a), ("b", block_b)):
            why = _untrusted(block, metric)
            if why:
                row.insufficient.append(f"pair {i} side {side}: {why}")
        a.append(block_a.get(metric))
        b.append(block_b.get(metric))
    if len(pairs) < 2:
        row.insufficient.append(f"{len(pairs)} complete pair(s); a paired verdict needs at least 2")
    if row.insufficient:
        return row
    row.decision = decide_paired(a, b, spec.direction, tolerance, alpha)
    row.differences = pair_differences(a, b, spec.direction, tolerance.scale)
    return row


def _untrusted(block: dict, metric: str) -> str | None:
    """Why this block's value of `metric` cannot be used, or None."""
    if block.get(metric) is None:
        return f"{metric} could not be computed ({'; '.join(block.get('notes') or []) or 'no value'})"
    requests = block.get("requests") or 0
    used = (block.get("successes") or 0) - (block.get("stalled_excluded") or 0 if metric in _TIMED else 0)
    if requests and used < requests / 2:
        return f"computed from {used} of {requests} requests (fewer than half)"
    return None


def report_markdown(report: PairedReport) -> str:
    a, b = report.labels["a"], report.labels["b"]
    verdict = "PASS" if report.passed else "REGRESSION" if report.regressions else "INSUFFICIENT"
    lines = [f"# Paired perf gate: `{b}` (b) against `{a}` (a)", "",
             f"Verdict: **{verdict}** ({len(report.regressions)} regression(s), {len(report.insufficient)} "
             f"insufficient, in {len(report.rows)} checks; {report.pairs} interleaved pairs)", "",
             "| point | metric | a | b | change (mean of pairs) | spread of pair ratios | tolerance | p (worse) | "
             "verdict |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in report.rows:
        d = r.decision
        if d is None:
            lines.append(f"| {r.point} | {r.metric} | | | | | {r.tolerance.describe()} | | insufficient |")
            continue
        relative = r.tolerance.scale == "relative"
        mean_change = (math.exp(-d.worse_by if r.direction == "higher" else d.worse_by) - 1) if relative \
            else (-d.worse_by if r.direction == "higher" else d.worse_by)
        verdict_text = d.verdict + (" (underpowered)" if d.underpowered and d.verdict == "pass" else "")
        p = "" if d.p_worse is None else f"{d.p_worse:.2g}"
        lines.append(f"| {r.point} | {r.metric} | {_fmt(d.baseline, r.unit)} | {_fmt(d.candidate, r.unit)} | "
                     f"{mean_change:+.1%} | {r.spread:.3f} | {r.tolerance.describe()} | {p} | {verdict_text} |"
                     if relative else
                     f"| {r.point} | {r.metric} | {_fmt(d.baseline, r.unit)} | {_fmt(d.candidate, r.unit)} | "
                     f"{mean_change:+.3g} | | {r.tolerance.describe()} | {p} | {verdict_text} |")
    lines += ["", "Requests left out of the timing percentiles (stalled on the client's side), per block:"]
    for point, by_side in report.excluded.items():
        lines.append(f"- {point}: {a}: {by_side['a']}; {b}: {by_side['b']}")
    for r in report.insufficient:
        lines.append(f"- {r.point} {r.metric} is insufficient: " + "; ".join(r.insufficient))
    if report.notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in report.notes]
    lines += ["", f"Rule: a regression is a worsening whose mean over the pairs is beyond the tolerance and "
              f"significant (one-sided paired t-test at {report.family_alpha:g} / {max(1, len(report.rows))} checks); "
              "a value computed from fewer than half of a block's requests is insufficient, never a pass."]
    return "\n".join(lines) + "\n"


def _fmt(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value:.2%}"
    return f"{value:.3g} {unit}"


def write_paired_report(report: PairedReport, directory: Path) -> tuple[Path, Path]:
    md, js = Path(directory) / "gate.md", Path(directory) / "gate.json"
    md.write_text(report_markdown(report))
    js.write_text(json.dumps(report.as_dict(), indent=2, sort_keys=True) + "\n")
    return md, js
