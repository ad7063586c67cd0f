"""The paired verdict (harness.gates.paired): its rule on exact pairs, a seeded simulation of its false alarms and
detection with the spread that separately started servers show, and the report of an interleaved run, insufficient
blocks included."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.bench.metrics import REGISTRY
from harness.gates.decision import Tolerance
from harness.gates.gate import FAMILY_ALPHA
from harness.paths import PAIRED_TOLERANCES_FILE
from harness.gates.paired import (PairedTolerances, control_spread, decide_paired, margin_for_pairs,
                                  margin_from_controls, pair_differences, paired_gate, report_markdown)
from tests.perf_gates.ci_design import MUST_FLAG, STEP_SHARE, WIDEST_PAIR_SPREAD, slowdown_of

TRIALS = 2000  # each sizes its tolerance anew: the rates are over the sizing's own error too


def test_pair_differences_are_log_ratios_oriented_so_that_worse_is_positive():
    assert pair_differences([100.0], [80.0], "higher", "relative") == [pytest.approx(-math.log(0.8))]
    assert pair_differences([1.0], [1.25], "lower", "relative") == [pytest.approx(math.log(1.25))]
    assert pair_differences([0.9], [0.5], "higher", "absolute") == [pytest.approx(0.4)]


@pytest.mark.parametrize(("direction", "ratio", "verdict"), [
    ("higher", 0.951, "pass"), ("higher", 0.949, "regression"),
    ("lower", 1.049, "pass"), ("lower", 1.051, "regression"),
])
def test_a_tolerance_of_five_percent_means_five_percent_worse_on_every_pair(direction, ratio, verdict):
    a = [100.0, 120.0, 90.0, 110.0]
    d = decide_paired(a, [x * ratio for x in a], direction, Tolerance(0.05))
    assert d.verdict == verdict and d.change == pytest.approx(ratio - 1)


def test_the_pairing_removes_what_both_sides_share():
    # Each pair's machine speed differs by up to 2x; b is 10% slower within every pair: a regression that
    # unpaired samples of this spread could not see.
    rng = np.random.default_rng(0)
    speed = np.exp(rng.uniform(-0.35, 0.35, 8))
    a = list(100 * speed * np.exp(rng.normal(0, 0.01, 8)))
    b = list(90 * speed * np.exp(rng.normal(0, 0.01, 8)))
    assert decide_paired(a, b, "higher", Tolerance(0.05), alpha=0.01).verdict == "regression"


def test_a_paired_verdict_needs_two_pairs_and_positive_values_for_ratios():
    with pytest.raises(ValueError, match="at least 2"):
        decide_paired([1.0], [1.0], "higher", Tolerance(0.05))
    with pytest.raises(ValueError, match="<= 0"):
        decide_paired([1.0, 0.0], [1.0, 1.0], "higher", Tolerance(0.05))
    with pytest.raises(ValueError, match="one a per b"):
        decide_paired([1.0, 1.0], [1.0], "higher", Tolerance(0.05))


def simulated_rate(rng, pairs: int, pair_sd: float, start_sd: float, shift_in_margins: float) -> float:
    """Share of trials flagged `regression` on a lower-is-better metric. Each trial sizes the tolerance from 30 A/A
    controls of its own (margin_from_controls), then measures: its pairs share a start offset (two separately
    started servers differ by N(0, start_sd) on the log scale) plus N(0, pair_sd) per pair, and b is worse by
    `shift_in_margins` times the trial's margin."""
    hits = 0
    for _ in range(TRIALS):
        tolerance = sized_tolerance(rng, pairs, pair_sd, start_sd)
        shift = shift_in_margins * tolerance.margin("lower")
        a = np.exp(rng.normal(0, pair_sd / math.sqrt(2), pairs))
        b = np.exp(rng.normal(shift + rng.normal(0, start_sd), pair_sd / math.sqrt(2), pairs))
        hits += decide_paired(list(a), list(b), "lower", tolerance, ALPHA).verdict == "regression"
    return hits / TRIALS


# (pairs, per-pair spread, start-to-start spread): around what A/A controls measure on the CI kinds.
CASES = [(8, 0.05, 0.02), (8, 0.10, 0.03), (6, 0.08, 0.04), (12, 0.10, 0.0)]
ALPHA = 0.05 / 2  # a check of a two-metric gate


def sized_tolerance(rng, pairs: int, pair_sd: float, start_sd: float, controls: int = 30) -> Tolerance:
    """The tolerance margin_from_controls sizes from `controls` simulated A/A controls, as a relative tolerance on a
    lower-is-better metric."""
    means = [rng.normal(0, start_sd) + rng.normal(0, pair_sd / math.sqrt(pairs)) for _ in range(controls)]
    return Tolerance(math.expm1(margin_from_controls(means, ALPHA)))


@pytest.mark.parametrize(("pairs", "pair_sd", "start_sd"), CASES)
def test_false_alarms_on_identical_servers_stay_under_the_checks_alpha(pairs, pair_sd, start_sd):
    rate = simulated_rate(np.random.default_rng(pairs * 100 + int(pair_sd * 1000)), pairs, pair_sd, start_sd, 0.0)
    assert rate <= ALPHA, f"false alarms {rate:.3f} > {ALPHA}"


@pytest.mark.parametrize(("pairs", "pair_sd", "start_sd"), CASES)
def test_a_regression_of_twice_the_tolerance_is_caught_nine_times_in_ten(pairs, pair_sd, start_sd):
    rate = simulated_rate(np.random.default_rng(7 + pairs), pairs, pair_sd, start_sd, 2.0)
    assert rate >= 0.9, f"caught {rate:.3f} of regressions of twice the tolerance"


def simulated_controls(rng, n: int, pairs: int, offset_sd: float, pair_sd: float, per_start: int = 3):
    """(controls, starts): `n` A/A controls of `pairs` pair differences, each start's offset shared by its controls."""
    controls, starts, offset = [], [], 0.0
    for i in range(n):
        if i % per_start == 0:
            offset = rng.normal(0, offset_sd)
        controls.append(list(rng.normal(offset, pair_sd, pairs)))
        starts.append(i // per_start)
    return controls, starts


def test_control_spread_tells_the_start_offset_from_the_pairs_spread():
    controls, starts = simulated_controls(np.random.default_rng(5), 300, 8, 0.03, 0.10)
    spread = control_spread(controls, starts)
    assert spread.offset_sd == pytest.approx(0.03, abs=0.01) and spread.pair_sd == pytest.approx(0.10, rel=0.05)
    assert spread.offset_bound >= spread.offset_sd
    assert control_spread(controls).offset_bound == spread.offset_sd  # no starts: no bound to take
    assert control_spread(controls, starts) == spread  # seeded: the same controls size the same tolerance


def test_controls_of_the_gates_size_give_what_their_mean_square_gives_and_shorter_ones_no_wider():
    rng = np.random.default_rng(6)
    controls, _ = simulated_controls(rng, 300, 16, 0.02, 0.10)
    means = [float(np.mean(d)) for d in controls]
    assert margin_for_pairs(controls, 0.01, 16) == pytest.approx(margin_from_controls(means, 0.01), rel=0.05)
    short, _ = simulated_controls(rng, 300, 8, 0.02, 0.10)
    assert margin_for_pairs(short, 0.01, 16) == pytest.approx(margin_for_pairs(controls, 0.01, 16), rel=0.1)
    assert margin_for_pairs(short, 0.01, 16) < 0.9 * margin_from_controls([float(np.mean(d)) for d in short], 0.01)


def test_without_an_offset_sixteen_pairs_need_a_margin_near_one_over_the_square_root_of_two_of_eights():
    # Near, not equal: the offset's estimate from finite controls is above 0 about half the time. (The ratio cannot
    # fall below 1/sqrt(2) by construction; sizing from the 8-pair means as they are would give 1.)
    controls, _ = simulated_controls(np.random.default_rng(7), 300, 8, 0.0, 0.10)
    ratio = margin_for_pairs(controls, 0.01, 16) / margin_for_pairs(controls, 0.01, 8)
    assert ratio < 0.8, ratio


def test_a_spread_needs_three_controls_of_two_pairs():
    with pytest.raises(ValueError, match="3 or more"):
        control_spread([[0.1, 0.2], [0.1, 0.0], [0.3]])


def test_a_tolerance_needs_three_controls_and_grows_with_their_spread():
    with pytest.raises(ValueError, match="3 or more"):
        margin_from_controls([0.01, -0.01], 0.025)
    assert margin_from_controls([0.02, -0.02, 0.02, -0.02], 0.025) < margin_from_controls([0.04, -0.04, 0.04, -0.04],
                                                                                            0.025)
    # an offset the twin keeps counts against it, as its spread does
    assert margin_from_controls([0.03] * 4, 0.025) == pytest.approx(margin_from_controls([0.03, -0.03] * 2, 0.025))


def write_interleaved(root: Path, a_blocks: list[dict], b_blocks: list[dict], point: str = "decode-micro@c2",
                      arms: tuple[str, str] = ("session", "twin")) -> Path:
    """An interleaved run's files (harness.gates.interleave) with arms `arms` (a, b)."""
    for arm, blocks in zip(arms, (a_blocks, b_blocks)):
        d = root / arm
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"model": "m"}))
        repeats = [{"repeat": i, "requests": 16, "successes": 16, "stalled_excluded": 0, "notes": [], **blk}
                   for i, blk in enumerate(blocks)]
        (d / "summary.json").write_text(json.dumps({"points": {point: {"repeats": repeats}}}))
    (root / "rounds.json").write_text(json.dumps({"arms": {arms[0]: "u1", arms[1]: "u2"}, "rounds": len(a_blocks),
                                                 "end_reason": "completed", "points": [point]}))
    return root


TOL = PairedTolerances({"decode-micro@c2": {"output_tps_p10": Tolerance(0.05)}}, {})


def test_an_arm_the_run_does_not_have_is_refused_naming_the_arms(tmp_path):
    from harness.errors import HarnessError

    run = write_interleaved(tmp_path, [{"output_tps_p10": 1.0}] * 2, [{"output_tps_p10": 1.0}] * 2)
    with pytest.raises(HarnessError, match="no arm 'reference'; its arms: session, twin"):
        paired_gate(run, "reference", "session", TOL)


def test_an_interleaved_run_with_a_slower_candidate_fails_and_names_the_point_and_metric(tmp_path):
    a = [{"output_tps_p10": v} for v in (300, 280, 310, 290, 305, 295)]
    b = [{"output_tps_p10": v * 0.8} for v in (300, 282, 306, 293, 301, 297)]
    report = paired_gate(write_interleaved(tmp_path, a, b), "session", "twin", TOL, {"decode-micro@c2": ("output_tps_p10",)})
    assert not report.passed
    assert report.row("decode-micro@c2", "output_tps_p10").verdict == "regression"
    md = report_markdown(report)
    assert "REGRESSION" in md and "output_tps_p10" in md and "twin" in md


def test_an_identical_candidate_passes(tmp_path):
    a = [{"output_tps_p10": v} for v in (300, 280, 310, 290, 305, 295)]
    b = [{"output_tps_p10": v * f} for v, f in zip((300, 280, 310, 290, 305, 295), (1.01, 0.99, 1.0, 1.02, 0.98, 1.0))]
    report = paired_gate(write_interleaved(tmp_path, a, b), "session", "twin", TOL, {"decode-micro@c2": ("output_tps_p10",)})
    assert report.passed, report_markdown(report)


def test_a_percentile_from_fewer_than_half_of_a_blocks_requests_is_insufficient_never_a_pass(tmp_path):
    a = [{"output_tps_p10": 300}] * 6
    b = [{"output_tps_p10": 300}] * 5 + [{"output_tps_p10": 300, "stalled_excluded": 9}]
    report = paired_gate(write_interleaved(tmp_path, a, b), "session", "twin", TOL, {"decode-micro@c2": ("output_tps_p10",)})
    row = report.row("decode-micro@c2", "output_tps_p10")
    assert row.verdict == "insufficient" and not report.passed
    assert "pair 5 side b: computed from 7 of 16 requests" in row.insufficient[0]
    assert "[0, 0, 0, 0, 0, 9]" in report_markdown(report)  # excluded requests, per block


def test_a_run_metric_keeps_every_success_so_excluded_stalls_do_not_make_it_insufficient(tmp_path):
    a = [{"weighted_throughput": 5000.0}] * 4
    b = [{"weighted_throughput": 5000.0, "stalled_excluded": 12}] * 4
    report = paired_gate(write_interleaved(tmp_path, a, b), "session", "twin", TOL, {"decode-micro@c2": ("weighted_throughput",)})
    assert report.row("decode-micro@c2", "weighted_throughput").verdict == "pass"


def test_not_an_interleaved_run_is_refused_with_the_command_that_makes_one(tmp_path):
    from harness.errors import HarnessError

    with pytest.raises(HarnessError, match="not an interleaved run"):
        paired_gate(tmp_path, "session", "twin")


# CI's own design (fixtures/gates/paired.yaml's pairs and tolerances, tests/perf_gates/ci_design.py's slowdowns):
# the tests that must flag catch their slowdowns at the widest pair spread CI has met, nearly always.
def start_sd(point: str, metric: str) -> float:
    """The start-to-start offset paired.yaml's tolerance of this check was sized with (its upper bound)."""
    return yaml.safe_load(PAIRED_TOLERANCES_FILE.read_text())["measured"]["spreads"][f"{point}:{metric}"]["offset_bound"]


MUST_FLAG_RATE = 0.99


def ci_detection_rate(rng, point: str, metric: str, effect: float, pairs: int, spread: float,
                      trials: int = 4000) -> float:
    """Share of trials in which CI's gate flags `metric` at `point`: pairs whose log worsening is `effect` plus one
    start-to-start offset per trial (N(0, start_sd), as paired.yaml's tolerance was sized with) plus N(0, spread)
    per pair, judged at paired.yaml's tolerance and the gate's alpha per check."""
    tolerances = PairedTolerances.load()
    checks = sum(len(metrics) for metrics in tolerances.points.values())
    spec = REGISTRY[metric]
    sign = -1.0 if spec.direction == "higher" else 1.0
    hits, offset_sd = 0, start_sd(point, metric)
    for _ in range(trials):
        d = rng.normal(effect + rng.normal(0, offset_sd), spread, pairs)
        verdict = decide_paired([1.0] * pairs, list(np.exp(sign * d)), spec.direction,
                                tolerances.tolerance(point, metric), FAMILY_ALPHA / checks).verdict
        hits += verdict == "regression"
    return hits / trials


@pytest.mark.parametrize("check", sorted(STEP_SHARE))
def test_ci_catches_its_injected_slowdowns_at_the_widest_spread_it_has_met(check):
    point, metric = check
    effect = math.log1p(slowdown_of(point) * STEP_SHARE[check])
    rate = ci_detection_rate(np.random.default_rng(11), point, metric, effect, PairedTolerances.load().pairs,
                             WIDEST_PAIR_SPREAD)
    assert rate >= MUST_FLAG_RATE, (f"{metric} at {point}: worse by {math.expm1(effect):.1%}, caught {rate:.3f} at "
                                    f"spread {WIDEST_PAIR_SPREAD}; raise the slowdown or the pairs")


def test_the_must_flag_checks_are_the_ones_whose_slowdown_share_was_measured():
    assert set().union(*MUST_FLAG.values()) == set(STEP_SHARE)


def test_the_design_before_2026_12_05_missed_at_that_spread():
    # 8 pairs and slowdowns of 0.4: CI's weighted throughput check at decode-micro, as it was when CI missed it.
    effect = math.log1p(0.4 * STEP_SHARE[("decode-micro@c2", "weighted_throughput")])
    rate = ci_detection_rate(np.random.default_rng(12), "decode-micro@c2", "weighted_throughput", effect, 8,
                             WIDEST_PAIR_SPREAD)
    assert rate < 0.5
