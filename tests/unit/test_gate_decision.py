"""The gate's decision rule, by seeded simulation: few false alarms, and real regressions caught.

Noise levels are those seen in recorded runs: per-repeat CV 2% (decode TPS on the BI-V100), 5% and 10%
(weighted throughput, TTFT on the tiny CPU server), 20% (TTFT P90 on the BI-V100: 9.8 s vs 12.7 s).
A "regression of twice the tolerance" is a shift of twice the margin on the log scale in the metric's worse
direction: a ratio of (1 - tol)^2 where higher is better, (1 + tol)^2 where lower is better.

The second half simulates what the gate really runs (`REAL_CASES`, alpha split over a 10-check gate) and
writes docs/gate-simulation.md: `python -m tests.unit.test_gate_decision > docs/gate-simulation.md`.
"""
from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from harness.gates.baseline import load_policy, tolerances_for
from harness.gates.decision import Tolerance, decide, min_tolerance
from harness.gates.gate import FAMILY_ALPHA

TRIALS = 1000
NOISE_LEVELS = [0.02, 0.05, 0.10, 0.20]
REPEATS = [(5, 5), (1, 5), (3, 3)]


def lognormal(rng, cv: float, n: int, centre: float = 10.0) -> np.ndarray:
    sigma = math.sqrt(math.log1p(cv**2))
    return centre * np.exp(rng.normal(0.0, sigma, n))


def worsened(tolerance: Tolerance, direction: str, times: float = 2.0) -> float:
    """The ratio candidate / baseline that is `times` the tolerance worse, on the comparison scale."""
    m = tolerance.margin(direction)
    return math.exp(-times * m if direction == "higher" else times * m)


def verdict_rate(rng, cv, nb, nc, direction, tolerance, shift_ratio, verdict="regression") -> float:
    """Fraction of trials with this verdict when the candidate is the baseline's distribution x shift_ratio."""
    hits = 0
    for _ in range(TRIALS):
        base, cand = lognormal(rng, cv, nb), lognormal(rng, cv, nc) * shift_ratio
        hits += decide(base, cand, direction, tolerance).verdict == verdict
    return hits / TRIALS


@pytest.mark.parametrize(("nb", "nc"), REPEATS, ids=lambda v: str(v))
@pytest.mark.parametrize("cv", NOISE_LEVELS)
@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_false_alarms_stay_at_or_under_five_percent_on_identical_distributions(direction, cv, nb, nc):
    rng = np.random.default_rng(1000 + int(cv * 100) * 10 + nb)
    tolerance = Tolerance(max(0.05, min_tolerance(cv, nb, nc, direction=direction)))
    rate = verdict_rate(rng, cv, nb, nc, direction, tolerance, shift_ratio=1.0)
    assert rate <= 0.05, f"false alarm rate {rate:.3f} at CV {cv}, n={nb}/{nc}, tol {tolerance.value:.3f}"


@pytest.mark.parametrize(("nb", "nc"), REPEATS, ids=lambda v: str(v))
@pytest.mark.parametrize("cv", NOISE_LEVELS)
@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_a_regression_of_twice_the_tolerance_is_caught_nine_times_in_ten(direction, cv, nb, nc):
    rng = np.random.default_rng(2000 + int(cv * 100) * 10 + nb)
    tolerance = Tolerance(max(0.05, min_tolerance(cv, nb, nc, direction=direction)))
    worse = worsened(tolerance, direction)
    rate = verdict_rate(rng, cv, nb, nc, direction, tolerance, shift_ratio=worse)
    assert rate >= 0.90, f"detection rate {rate:.3f} at CV {cv}, n={nb}/{nc}, tol {tolerance.value:.3f}"


@pytest.mark.parametrize(("direction", "ratio", "verdict"), [
    ("higher", 0.951, "pass"), ("higher", 0.949, "regression"),  # a drop of 4.9% / 5.1%
    ("lower", 1.049, "pass"), ("lower", 1.051, "regression"),  # a rise of 4.9% / 5.1%
])
def test_a_five_percent_tolerance_means_five_percent_worse_in_either_direction(direction, ratio, verdict):
    # Identical repeats on each side: no noise, so the difference is exact and only the tolerance decides.
    d = decide([100.0] * 4, [100.0 * ratio] * 4, direction, Tolerance(0.05))
    assert d.verdict == verdict and d.change == pytest.approx(ratio - 1)


def test_a_relative_tolerance_of_100_percent_cannot_gate_a_higher_is_better_metric():
    with pytest.raises(ValueError, match="allows a drop of 100% or more"):
        decide([1.0], [1.0], "higher", Tolerance(1.0))
    assert Tolerance(1.0).margin("lower") == pytest.approx(math.log(2))


def test_min_tolerance_inverts_the_margin_of_its_direction():
    for direction in ("higher", "lower"):
        tol = Tolerance(min_tolerance(0.1, 5, 3, alpha=0.005, direction=direction))
        assert tol.margin(direction) == pytest.approx(Tolerance(min_tolerance(0.1, 5, 3, alpha=0.005)).margin("lower"))
    assert min_tolerance(0.1, 5, 3, direction="higher") < min_tolerance(0.1, 5, 3)  # direction-free: the larger


def test_a_change_inside_the_tolerance_is_not_a_regression_however_certain():
    # Zero noise, 3% worse, 5% tolerance: significant but not beyond the tolerance.
    d = decide([100.0] * 5, [97.0] * 5, "higher", Tolerance(0.05))
    assert d.verdict == "pass" and not d.underpowered


def test_improvements_are_reported_as_such():
    rng = np.random.default_rng(3)
    base, cand = lognormal(rng, 0.02, 5), lognormal(rng, 0.02, 5) * 1.3
    assert decide(base, cand, "higher", Tolerance(0.05)).verdict == "improvement"
    assert decide(base, cand, "lower", Tolerance(0.05)).verdict == "regression"


def test_absolute_scale_for_rates_in_points():
    # Success rate 100% -> 95% with a 1-point tolerance: a regression, even with no spread.
    d = decide([1.0, 1.0, 1.0], [0.95, 0.95, 0.95], "higher", Tolerance(0.01, "absolute"))
    assert d.verdict == "regression" and d.change == pytest.approx(-0.05)


def test_single_runs_on_both_sides_are_never_a_confident_pass():
    small = decide([12.7], [13.5], "lower", Tolerance(0.10))
    assert small.verdict == "inconclusive" and small.underpowered and "single runs" in small.note
    large = decide([12.7], [16.0], "lower", Tolerance(0.10))  # +26% > twice the tolerance
    assert large.verdict == "regression"


def test_a_single_imported_baseline_borrows_the_candidates_noise_and_says_so():
    d = decide([6.0], [5.0, 5.1, 4.9, 5.05, 4.95], "higher", Tolerance(0.05))
    assert d.verdict == "regression"
    assert "baseline is a single run" in d.note


def test_a_wide_noise_band_is_flagged_underpowered_rather_than_passed_silently():
    rng = np.random.default_rng(4)
    d = decide(lognormal(rng, 0.3, 3), lognormal(rng, 0.3, 3), "higher", Tolerance(0.05))
    assert d.verdict == "pass" and d.underpowered


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(baseline=[], candidate=[1.0]), "at least one repeat"),
        (dict(baseline=[1.0, float("nan")], candidate=[1.0]), "non-finite"),
        (dict(baseline=[0.0, 1.0], candidate=[1.0]), "give this metric an absolute tolerance"),
        (dict(baseline=[1.0], candidate=[1.0], direction="info"), "'info' metric is not gated"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    args = dict(direction="higher", tolerance=Tolerance(0.05)) | kwargs
    with pytest.raises(ValueError, match=message):
        decide(**args)


def test_min_tolerance_grows_with_noise_and_shrinks_with_repeats():
    assert min_tolerance(0.05, 5, 5) < min_tolerance(0.10, 5, 5)
    assert min_tolerance(0.05, 10, 10) < min_tolerance(0.05, 5, 5) < min_tolerance(0.05, 1, 5)
    with pytest.raises(ValueError, match="record at least 2 repeats"):
        min_tolerance(0.05, 1, 1)


def test_a_gate_of_five_metrics_keeps_its_family_false_alarm_rate_under_five_percent():
    """Bonferroni: each of k checks tests at 0.05 / k, so the whole gate cries wolf at most 5% of the time."""
    rng = np.random.default_rng(5)
    k, cv, n = 5, 0.05, 5
    alpha = 0.05 / k
    tolerance = Tolerance(min_tolerance(cv, n, n, alpha=alpha))
    alarms = 0
    for _ in range(TRIALS):
        alarms += any(
            decide(lognormal(rng, cv, n), lognormal(rng, cv, n), "higher", tolerance, alpha=alpha).verdict == "regression"
            for _ in range(k)
        )
    assert alarms / TRIALS <= 0.05
    # ... and still catches a regression of twice the tolerance in one metric nine times in ten.
    worse = worsened(tolerance, "higher")
    hits = sum(
        decide(lognormal(rng, cv, n), lognormal(rng, cv, n) * worse, "higher", tolerance, alpha=alpha).verdict == "regression"
        for _ in range(TRIALS)
    )
    assert hits / TRIALS >= 0.90


# ---- What the gate really runs -------------------------------------------------------------------------------
# Repeat counts (baseline / candidate) of the three ways the gate has been used: an in-session recording
# interleaved 4 and 4 runs (until the paired gates replaced it); a committed baseline has 5 repeats and 3 are
# gated against it; the live gate runs --gate-repeats 3 against the imported single-run BI-V100 baseline.
REAL_CASES = {"in-session": (4, 4), "committed baseline": (5, 3), "live": (1, 3)}
GATE_CHECKS = 10  # 2 points x 5 gated metrics
GATE_ALPHA = FAMILY_ALPHA / GATE_CHECKS  # Bonferroni, as gate() splits it: 0.005 per check
GATES, DETECTION_TRIALS = 400, 2000  # 4000 checks per case for the false-alarm rate


@dataclass(frozen=True)
class Noise:
    name: str
    cv: float  # lognormal noise of every repeat
    stall_p: float = 0.0  # a repeat is stalled with this probability ...
    stall: float = 0.3  # ... and then this much worse

    def draw(self, rng, n: int, direction: str) -> np.ndarray:
        values = lognormal(rng, self.cv, n)
        if self.stall_p:
            worse = 1 - self.stall if direction == "higher" else 1 + self.stall
            values = np.where(rng.random(n) < self.stall_p, values * worse, values)
        return values

    def measured_cv(self, direction: str) -> float:
        """The CV a baseline's repeats show (exact for lognormal noise, from 200 000 draws for stalls)."""
        if not self.stall_p:
            return self.cv
        big = self.draw(np.random.default_rng(99), 200_000, direction)
        return float(big.std(ddof=1) / big.mean())


NOISES = [Noise("lognormal CV 2%", 0.02), Noise("lognormal CV 5%", 0.05), Noise("lognormal CV 10%", 0.10),
          Noise("lognormal CV 20%", 0.20), Noise("CV 5% + 20% of repeats stalled 30% worse", 0.05, stall_p=0.2)]
BIMODAL = NOISES[-1]
# The gated metric of each direction whose policy tolerance applies (5% and 10%).
METRIC = {"higher": "output_tps_p10", "lower": "ttft_p90"}


def recorded_tolerance(cv: float, nb: int, nc: int, direction: str) -> Tolerance:
    """What tolerances_for records for this noise: a 2-point baseline of the 5 policy metrics (so alpha is
    split 10 ways, as the gate splits it) whose repeats have exactly this CV, sized for nc candidate repeats.
    A single-run baseline has no noise to size from; the live gate's noise is the candidate's, so there the
    tolerance is the one min_tolerance gives for it."""
    metric, policy = METRIC[direction], load_policy()
    if nb < 2:
        needed = min_tolerance(cv, nb, nc, alpha=GATE_ALPHA, direction=direction)
        return Tolerance(max(policy[metric].value, needed))
    z = np.linspace(-1.0, 1.0, nb)
    repeats = [{metric: float(1 + cv * x)} for x in (z - z.mean()) / z.std(ddof=1)]  # sample CV = cv exactly
    tolerances, _, _ = tolerances_for({"a": repeats, "b": repeats}, policy, candidate_repeats=nc)
    return tolerances["a"][metric]


@dataclass(frozen=True)
class Rates:
    tolerance: Tolerance
    false_alarm_check: float  # per check, identical distributions
    false_alarm_gate: float  # per 10-check gate
    detection: float  # a worsening of twice the tolerance
    detection_at_policy: float | None  # live only: twice the imported baseline's own (policy) tolerance


@functools.lru_cache(maxsize=None)
def simulate(case: str, noise: Noise, direction: str) -> Rates:
    nb, nc = REAL_CASES[case]
    rng = np.random.default_rng([list(REAL_CASES).index(case), NOISES.index(noise), direction == "higher"])
    tolerance = recorded_tolerance(noise.measured_cv(direction), nb, nc, direction)

    def regression(tol: Tolerance, ratio: float = 1.0) -> bool:
        base, cand = noise.draw(rng, nb, direction), noise.draw(rng, nc, direction) * ratio
        return decide(base, cand, direction, tol, alpha=GATE_ALPHA).verdict == "regression"

    alarms = [sum(regression(tolerance) for _ in range(GATE_CHECKS)) for _ in range(GATES)]
    worse = worsened(tolerance, direction)
    detection = sum(regression(tolerance, worse) for _ in range(DETECTION_TRIALS)) / DETECTION_TRIALS
    at_policy = None
    if nb == 1:
        policy = load_policy()[METRIC[direction]]
        at_policy = sum(regression(policy, worsened(policy, direction)) for _ in range(DETECTION_TRIALS)) / DETECTION_TRIALS
    return Rates(tolerance, sum(alarms) / (GATES * GATE_CHECKS), sum(a > 0 for a in alarms) / GATES, detection,
                 at_policy)


def simulation_error(rate: float, n: int) -> float:
    return 3 * math.sqrt(rate * (1 - rate) / n)  # three standard errors of a measured rate


REAL = [(case, noise, direction) for case in REAL_CASES for noise in NOISES for direction in ("higher", "lower")]
REAL_IDS = [f"{case}-{noise.name}-{direction}" for case, noise, direction in REAL]


@pytest.mark.parametrize(("case", "noise", "direction"), REAL, ids=REAL_IDS)
def test_false_alarms_of_the_real_gate_stay_within_its_budget(case, noise, direction):
    r = simulate(case, noise, direction)
    assert r.false_alarm_check <= GATE_ALPHA + simulation_error(GATE_ALPHA, GATES * GATE_CHECKS), r
    assert r.false_alarm_gate <= FAMILY_ALPHA, r


@pytest.mark.parametrize(("case", "noise", "direction"), REAL, ids=REAL_IDS)
def test_the_real_gate_catches_twice_its_recorded_tolerance(case, noise, direction):
    r = simulate(case, noise, direction)
    # Lognormal noise is what min_tolerance is calibrated for: nine times in ten. A stall mixture is not
    # lognormal: its CV understates how the rule sees it, and detection drops (measured 85-98%; the table).
    assert r.detection >= (0.80 if noise is BIMODAL else 0.90), r


def test_the_live_gate_at_the_imported_baselines_own_tolerance_misses_most_regressions_of_twice_it():
    # Not a property to keep but one to know: 1 imported run against 3 candidate repeats at alpha 0.005
    # cannot resolve 5% or 10%; the report flags such checks `underpowered`.
    assert all(simulate("live", noise, d).detection_at_policy < 0.6 for noise in NOISES for d in ("higher", "lower"))


DOC_INTRO = """# The perf gate's decision rule, simulated

Produced by `python -m tests.unit.test_gate_decision` (seeded; the same numbers as the tests in
tests/unit/test_gate_decision.py assert on). Each row: {gates} simulated gates of {checks} checks on identical
baseline and candidate distributions for the false alarms, {trials} trials with the candidate worse by twice
the tolerance for the detection. Per-check alpha {alpha:g}: the family budget {family:g} split over
{checks} checks (2 points x 5 metrics, Bonferroni), as `gate()` does.

- **tolerance**: what `tolerances_for` records for that noise and those repeats (the policy's 5% for a
  higher-is-better metric, 10% for TTFT P90, raised to `min_tolerance`); the live case's baseline is a
  single imported run, so there it is what `min_tolerance` gives for the candidate's noise.
- **stalls**: each repeat is lognormal (CV 5%) and, with probability 20%, 30% worse; its tolerance is the
  one `min_tolerance` gives for the mixture's measured CV.
- A tolerance of 5% means 5% worse: candidate / baseline <= 0.95 (higher is better), >= 1.05 (lower).
"""


def simulation_markdown() -> str:
    lines = [DOC_INTRO.format(gates=GATES, checks=GATE_CHECKS, trials=DETECTION_TRIALS, alpha=GATE_ALPHA,
                              family=FAMILY_ALPHA),
             "| case | n base/cand | noise | better | tolerance | false alarms per check | "
             "false alarms per 10-check gate | detection at 2x tolerance |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for case, noise, direction in REAL:
        r, (nb, nc) = simulate(case, noise, direction), REAL_CASES[case]
        lines.append(f"| {case} | {nb}/{nc} | {noise.name} | {direction} | {r.tolerance.value:.1%} | "
                     f"{r.false_alarm_check:.2%} | {r.false_alarm_gate:.1%} | {r.detection:.1%} |")
    lines += ["", "The live gate against the imported baseline's own tolerances (5% Output TPS P10, 10% TTFT P90): "
              "a worsening of twice that tolerance is caught", ""]
    for noise in NOISES:
        hi, lo = (simulate("live", noise, d).detection_at_policy for d in ("higher", "lower"))
        lines.append(f"- {noise.name}: {hi:.1%} (higher is better, 5%), {lo:.1%} (lower is better, 10%)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(simulation_markdown())
