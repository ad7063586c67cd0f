"""The gate's decision rule, by seeded simulation: few false alarms, and real regressions caught.

Noise levels are those seen in recorded runs: per-repeat CV 2% (decode TPS on the BI-V100), 5% and 10%
(weighted throughput, TTFT on the tiny CPU server), 20% (TTFT P90 on the BI-V100: 9.8 s vs 12.7 s).
A "regression of twice the tolerance" is a shift of 2 * log(1 + tol) on the log scale, (1 + tol)^2 as a
ratio (slightly smaller than 1 + 2 tol, so the check is the stricter one).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from harness.gates.decision import Tolerance, decide, min_tolerance

TRIALS = 1000
NOISE_LEVELS = [0.02, 0.05, 0.10, 0.20]
REPEATS = [(5, 5), (1, 5), (3, 3)]


def lognormal(rng, cv: float, n: int, centre: float = 10.0) -> np.ndarray:
    sigma = math.sqrt(math.log1p(cv**2))
    return centre * np.exp(rng.normal(0.0, sigma, n))


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
    tolerance = Tolerance(max(0.05, min_tolerance(cv, nb, nc)))
    rate = verdict_rate(rng, cv, nb, nc, direction, tolerance, shift_ratio=1.0)
    assert rate <= 0.05, f"false alarm rate {rate:.3f} at CV {cv}, n={nb}/{nc}, tol {tolerance.value:.3f}"


@pytest.mark.parametrize(("nb", "nc"), REPEATS, ids=lambda v: str(v))
@pytest.mark.parametrize("cv", NOISE_LEVELS)
@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_a_regression_of_twice_the_tolerance_is_caught_nine_times_in_ten(direction, cv, nb, nc):
    rng = np.random.default_rng(2000 + int(cv * 100) * 10 + nb)
    tolerance = Tolerance(max(0.05, min_tolerance(cv, nb, nc)))
    worse = (1 + tolerance.value) ** (-2 if direction == "higher" else 2)
    rate = verdict_rate(rng, cv, nb, nc, direction, tolerance, shift_ratio=worse)
    assert rate >= 0.90, f"detection rate {rate:.3f} at CV {cv}, n={nb}/{nc}, tol {tolerance.value:.3f}"


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
    worse = (1 + tolerance.value) ** -2
    hits = sum(
        decide(lognormal(rng, cv, n), lognormal(rng, cv, n) * worse, "higher", tolerance, alpha=alpha).verdict == "regression"
        for _ in range(TRIALS)
    )
    assert hits / TRIALS >= 0.90
