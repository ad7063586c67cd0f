"""The gate's decision rule: is the candidate worse than the baseline beyond the tolerance, beyond noise?

Per metric, from every repeat of both sides, in the metric's direction:
1. Values are compared on a log scale for `relative` tolerances (a ratio, so 5% means the same at 6 and at
   600 tok/s) and as they are for `absolute` ones (rates such as success or cache hit, in points).
2. d = how much worse the candidate's mean is than the baseline's (positive = worse); m = the tolerance on
   that scale, so that "5%" means 5% worse in either direction: a higher-is-better metric is worse beyond
   candidate / baseline <= 1 - tol (m = -log(1 - tol)), a lower-is-better one beyond candidate / baseline
   >= 1 + tol (m = log(1 + tol)); an absolute tolerance is m = tol.
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
of twice the tolerance (2m on the comparison scale) is caught at least 90% of the time when the tolerance is
at least `min_tolerance`; docs/gate-simulation.md has the rates at the repeat counts the gate really runs.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
from scipy import special

Direction = Literal["higher", "lower"]
Scale = Literal["relative", "absolute"]
Verdict = Literal["pass", "regression", "improvement", "inconclusive"]

__all__ = ["Tolerance", "Decision", "decide", "t_verdict", "min_margin", "min_tolerance"]

# min_margin's margin over its calibration (drawn from _CALIBRATION_DRAWS samples, normal noise): room for the
# calibration's own sampling error and for noise that is not normal on the comparison scale.
SAFETY = 1.1
_CALIBRATION_DRAWS = 40_000


@dataclass(frozen=True)
class Tolerance:
    value: float
    scale: Scale = "relative"

    def __post_init__(self) -> None:
        if self.scale not in ("relative", "absolute"):
            raise ValueError(f"tolerance scale {self.scale!r} must be 'relative' or 'absolute'")
        if not self.value > 0:
            raise ValueError(f"tolerance {self.value} must be positive")

    def margin(self, direction: Direction) -> float:
        """The tolerance on the comparison scale, for a metric where `direction` is better: the log-distance
        of a change that is exactly `value` worse."""
        if self.scale == "absolute":
            return self.value
        if direction == "lower":
            return math.log1p(self.value)
        if self.value >= 1:
            raise ValueError(
                f"relative tolerance {self.value:.1%} on a higher-is-better metric allows a drop of 100% or more, "
                "so nothing could fail; give a tolerance under 1 (record the baseline again if it came from one)"
            )
        return -math.log1p(-self.value)

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
    m = tolerance.margin(direction)
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
    verdict, p_worse, underpowered = t_verdict(d, se, df, m, alpha)
    return Decision(verdict, p_worse=p_worse, underpowered=underpowered, note=note, **common)


def t_verdict(d: float, se: float, df: float, m: float, alpha: float) -> tuple[Verdict, float, bool]:
    """(verdict, one-sided p that the candidate is worse, underpowered) for an estimated worsening `d` with
    standard error `se` on `df` degrees of freedom, at margin `m`: the rule of the module docstring, which the
    paired gate (harness.gates.paired) applies to pair differences as well."""
    # scipy.special's Student t directly: the same values as scipy.stats.t, without its per-call overhead.
    p_worse = float(special.stdtr(df, -d / se))
    p_better = float(special.stdtr(df, d / se))
    if p_worse < alpha and d > m:
        verdict: Verdict = "regression"
    elif p_better < alpha and -d > m:
        verdict = "improvement"
    else:
        verdict = "pass"
    underpowered = verdict == "pass" and d + float(special.stdtrit(df, 1 - alpha)) * se > m
    return verdict, p_worse, underpowered


def _standard_error(yb: list[float], yc: list[float]) -> tuple[float | None, float, str]:
    """(standard error of the mean difference, degrees of freedom, note) by Welch, or the n = 1 fallbacks."""
    nb, nc = len(yb), len(yc)
    if nb >= 2 and nc >= 2:
        vb, vc = _variance(yb) / nb, _variance(yc) / nc
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
    s2 = _variance(many)
    note = (f"the {single_side} is a single run: its noise is assumed equal to the other side's "
            f"({len(many)} repeats)")
    return math.sqrt(s2 * (1 / len(many) + 1.0)), len(many) - 1, note


def _variance(y: list[float]) -> float:
    """Sample variance in floats (statistics.variance works in exact fractions: most of decide()'s time);
    identical values give exactly 0, so a deterministic metric keeps its exact comparison."""
    if all(v == y[0] for v in y):
        return 0.0
    mean = math.fsum(y) / len(y)
    return math.fsum((v - mean) ** 2 for v in y) / (len(y) - 1)


def min_margin(sigma: float, n_baseline: int, n_candidate: int, alpha: float = 0.05, power: float = 0.9) -> float:
    """The smallest margin m (on the comparison scale) for which this rule catches a true worsening of 2m with
    the given power, when one repeat has spread `sigma` on that scale."""
    if n_baseline < 2 and n_candidate < 2:
        raise ValueError("no tolerance makes single runs on both sides reliable: record at least 2 repeats")
    nb, nc = max(n_baseline, 1), max(n_candidate, 1)
    return _margin_factor(nb, nc, alpha, power) * sigma * math.sqrt(1 / nb + 1 / nc) * SAFETY


@functools.lru_cache(maxsize=256)
def _margin_factor(nb: int, nc: int, alpha: float, power: float) -> float:
    """m / se (se: the true standard error of the mean difference) at which the rule flags a true shift of 2m
    with the wanted power. Closed forms (t quantiles at n_b + n_c - 2 degrees of freedom, or a noncentral t)
    fall well short at the gate's per-check alpha with 3 to 5 repeats: Welch's degrees of freedom are
    estimated from the same few repeats and are often far lower. So the rule's own statistics are drawn, by
    a seeded Monte Carlo under normal values on the comparison scale with equal spreads (deterministic), and
    the factor is found by bisection; the simulation test checks the result on the gate's repeat counts."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal(_CALIBRATION_DRAWS)  # the mean difference's error, in units of se
    if min(nb, nc) >= 2:
        vb = rng.chisquare(nb - 1, _CALIBRATION_DRAWS) / (nb - 1) / nb
        vc = rng.chisquare(nc - 1, _CALIBRATION_DRAWS) / (nc - 1) / nc
        se_hat, df = np.sqrt(vb + vc), (vb + vc) ** 2 / (vb**2 / (nb - 1) + vc**2 / (nc - 1))
    else:  # the n = 1 fallback: the other side's spread for both
        n = max(nb, nc)
        se_hat = np.sqrt(rng.chisquare(n - 1, _CALIBRATION_DRAWS) / (n - 1) * (1 / n + 1.0))
        df = np.full(_CALIBRATION_DRAWS, n - 1.0)
    # Flagged when the estimate 2m + z exceeds both m and the t threshold (in units of the true se).
    threshold = special.stdtrit(df, 1 - alpha) * se_hat / math.sqrt(1 / nb + 1 / nc)

    def caught(x: float) -> float:
        return float(np.mean((z > -x) & (2 * x + z > threshold)))

    lo, hi = 0.0, 1.0
    while caught(hi) < power:
        lo, hi = hi, 2 * hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if caught(mid) < power else (lo, mid)
    return hi


def min_tolerance(cv: float, n_baseline: int, n_candidate: int, alpha: float = 0.05, power: float = 0.9,
                  direction: Direction | None = None) -> float:
    """`min_margin` as a relative tolerance, for a per-repeat coefficient of variation `cv`: the inverse of
    `Tolerance.margin` for `direction`. Without a direction, the larger of the two (lower-is-better's), which
    is enough for either. Baselines store max(policy tolerance, this)."""
    sigma = math.sqrt(math.log1p(cv**2))  # the log-scale spread of a lognormal with this CV
    m = min_margin(sigma, n_baseline, n_candidate, alpha, power)
    return -math.expm1(-m) if direction == "higher" else math.expm1(m)
