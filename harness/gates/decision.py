"""The gate's decision rule: is the candidate worse than the baseline beyond the tolerance, beyond noise?

Per metric, from every repeat of both sides, in the metric's direction:
1. Values are compared on a log scale for `relative` tolerances (a ratio, so 5% means the same at 6 and at
   600 tok/s) and as they are for `absolute` ones (rates such as success or cache hit, in points).
2. d = how much worse the candidate's mean is than the baseline's (positive = worse); m = the tolerance on
   that scale (log(1 + tol) or tol).
3. `regression` needs BOTH: the worsening is statistically significant (one-sided Welch t-test, p < alpha)
   AND its estimate exceeds the tolerance (d > m). `improvement` is the mirror image. Otherwise `pass`.
   Significance alone would flag real but negligible changes; the tolerance alone would flag noise.
   This is the rule asv uses (a significance test plus a factor), with Welch's test for unequal spreads.
4. A single imported run (n = 1) has no spread of its own: the candidate's repeats supply the noise
   estimate, and the report says so. With n = 1 on both sides there is no noise estimate at all: the verdict
   is `regression` only beyond twice the tolerance, else `inconclusive`; never a confident `pass`.
5. `underpowered` is set when the data cannot rule out a regression of the tolerance's size (the upper
   confidence bound of d exceeds m): the gate passes, and the report says the check was weak.

No retries: one decision per metric from the repeats recorded. tests/unit/test_gate_decision.py shows by a
seeded simulation that false alarms on identical distributions stay at or under alpha and that a regression
of twice the tolerance is caught at least 90% of the time when the tolerance is at least `min_tolerance`.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal, Sequence

from scipy import stats

Direction = Literal["higher", "lower"]
Scale = Literal["relative", "absolute"]
Verdict = Literal["pass", "regression", "improvement", "inconclusive"]

__all__ = ["Tolerance", "Decision", "decide", "min_margin", "min_tolerance"]

# min_tolerance's margin over its approximation (Welch's degrees of freedom fall below n_b + n_c - 2 when
# the sample spreads differ); set so the seeded simulation reaches 90% detection with room to spare.
SAFETY = 1.15


@dataclass(frozen=True)
class Tolerance:
    value: float
    scale: Scale = "relative"

    def __post_init__(self) -> None:
        if self.scale not in ("relative", "absolute"):
            raise ValueError(f"tolerance scale {self.scale!r} must be 'relative' or 'absolute'")
        if not self.value > 0:
            raise ValueError(f"tolerance {self.value} must be positive")

    @property
    def margin(self) -> float:
        """The tolerance on the comparison scale."""
        return math.log1p(self.value) if self.scale == "relative" else self.value

    def describe(self) -> str:
        return f"{self.value:.1%}" if self.scale == "relative" else f"{self.value:g} abs"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    baseline: float  # centre of the baseline repeats (geometric mean for relative, mean for absolute)
    candidate: float
    change: float  # candidate / baseline - 1 (relative) or candidate - baseline (absolute), signed as measured
    worse_by: float  # d on the comparison scale: positive means worse
    p_worse: float | None  # one-sided p-value that the candidate is worse; None without a noise estimate
    n_baseline: int
    n_candidate: int
    underpowered: bool
    note: str


def _transform(values: Sequence[float], scale: Scale, what: str) -> list[float]:
    if scale == "relative":
        if any(v <= 0 for v in values):
            raise ValueError(
                f"{what} has a value <= 0 ({list(values)}): a relative tolerance compares ratios; "
                "give this metric an absolute tolerance"
            )
        return [math.log(v) for v in values]
    return list(values)


def _centre(y: Sequence[float], scale: Scale) -> float:
    m = statistics.fmean(y)
    return math.exp(m) if scale == "relative" else m


def decide(
    baseline: Sequence[float],
    candidate: Sequence[float],
    direction: Direction,
    tolerance: Tolerance,
    alpha: float = 0.05,
) -> Decision:
    """The verdict for one metric; see the module docstring for the rule."""
    if direction not in ("higher", "lower"):
        raise ValueError(f"direction {direction!r} must be 'higher' or 'lower' (an 'info' metric is not gated)")
    baseline, candidate = [float(v) for v in baseline], [float(v) for v in candidate]
    if not baseline or not candidate:
        raise ValueError("both the baseline and the candidate need at least one repeat")
    for side, values in (("baseline", baseline), ("candidate", candidate)):
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"the {side} has a non-finite value: {list(values)}")
    yb = _transform(baseline, tolerance.scale, "the baseline")
    yc = _transform(candidate, tolerance.scale, "the candidate")
    sign = 1.0 if direction == "lower" else -1.0  # orient so that positive d means worse
    d = sign * (statistics.fmean(yc) - statistics.fmean(yb))
    m = tolerance.margin
    b_centre, c_centre = _centre(yb, tolerance.scale), _centre(yc, tolerance.scale)
    change = c_centre / b_centre - 1 if tolerance.scale == "relative" else c_centre - b_centre
    common = dict(baseline=b_centre, candidate=c_centre, change=change, worse_by=d,
                  n_baseline=len(yb), n_candidate=len(yc))

    se, df, note = _standard_error(yb, yc)
    if se is None:
        verdict: Verdict = "regression" if d > 2 * m else "improvement" if -d > 2 * m else "inconclusive"
        return Decision(verdict, p_worse=None, underpowered=True, note=note, **common)
    if se == 0.0:
        # Identical repeats on both sides (a deterministic metric): the difference is exact.
        verdict = "regression" if d > m else "improvement" if -d > m else "pass"
        return Decision(verdict, p_worse=0.0 if d > 0 else 1.0, underpowered=False,
                        note=note or "no spread in the repeats: the difference is exact", **common)
    t = stats.t
    p_worse = float(t.sf(d / se, df))
    p_better = float(t.cdf(d / se, df))
    if p_worse < alpha and d > m:
        verdict = "regression"
    elif p_better < alpha and -d > m:
        verdict = "improvement"
    else:
        verdict = "pass"
    upper = d + float(t.ppf(1 - alpha, df)) * se
    underpowered = verdict == "pass" and upper > m
    return Decision(verdict, p_worse=p_worse, underpowered=underpowered, note=note, **common)


def _standard_error(yb: list[float], yc: list[float]) -> tuple[float | None, float, str]:
    """(standard error of the mean difference, degrees of freedom, note) by Welch, or the n = 1 fallbacks."""
    nb, nc = len(yb), len(yc)
    if nb >= 2 and nc >= 2:
        vb, vc = statistics.variance(yb) / nb, statistics.variance(yc) / nc
        se2 = vb + vc
        if se2 == 0:
            return 0.0, math.inf, ""
        df = se2**2 / ((vb**2 / (nb - 1) if vb else 0.0) + (vc**2 / (nc - 1) if vc else 0.0))
        return math.sqrt(se2), df, ""
    if nb == 1 and nc == 1:
        return None, 0.0, (
            "single runs on both sides: no noise estimate, so a regression is flagged only beyond twice the "
            "tolerance and anything less is inconclusive; record repeats"
        )
    # One side has a single run: assume it has the other side's spread.
    many, single_side = (yc, "baseline") if nb == 1 else (yb, "candidate")
    s2 = statistics.variance(many)
    note = (f"the {single_side} is a single run: its noise is assumed equal to the other side's "
            f"({len(many)} repeats)")
    return math.sqrt(s2 * (1 / len(many) + 1.0)), len(many) - 1, note


def min_margin(sigma: float, n_baseline: int, n_candidate: int, alpha: float = 0.05, power: float = 0.9) -> float:
    """The smallest margin m (on the comparison scale) for which this rule catches a true worsening of 2m with
    the given power, when one repeat has spread `sigma` on that scale."""
    if n_baseline < 2 and n_candidate < 2:
        raise ValueError("no tolerance makes single runs on both sides reliable: record at least 2 repeats")
    nb, nc = max(n_baseline, 1), max(n_candidate, 1)
    se = sigma * math.sqrt(1 / nb + 1 / nc)
    df = nb + nc - 2 if min(nb, nc) >= 2 else max(nb, nc) - 1  # the n = 1 fallback borrows one side's spread
    t_alpha, t_power = float(stats.t.ppf(1 - alpha, df)), float(stats.t.ppf(power, df))
    # A true shift of 2m is flagged when the estimate exceeds max(t_alpha * se, m): with the wanted power
    # when m >= (t_alpha + t_power) * se / 2 (if that is below t_alpha * se), else m >= t_power * se.
    # Quantiles of t rather than the normal account for the spread being estimated from few repeats;
    # the simulation test checks the result.
    k = (t_alpha + t_power) / 2 if t_power < t_alpha else t_power
    return k * se * SAFETY


def min_tolerance(cv: float, n_baseline: int, n_candidate: int, alpha: float = 0.05, power: float = 0.9) -> float:
    """`min_margin` as a relative tolerance, for a per-repeat coefficient of variation `cv`.
    Baselines store max(policy tolerance, this)."""
    sigma = math.sqrt(math.log1p(cv**2))  # the log-scale spread of a lognormal with this CV
    return math.expm1(min_margin(sigma, n_baseline, n_candidate, alpha, power))
