"""harness.gates.evidence.calibrate's analysis on synthetic runs: tolerances sized from the controls (never under the
policy's), each control judged leave-one-out, detections counted per size, the confirmation round's rule ("two
looks") counted the same ways, the machine taken from the measurement, and the file written back."""
from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from harness.gates.evidence.calibrate import MACHINE_FILE, analyse, measured_on, report_markdown, write_tolerances
from harness.gates.decision import Tolerance
from harness.gates.paired import PairedTolerances

TPS, TTFT = "decode-micro@c2:output_tps_p10", "official-like@c1:ttft_p90"
TOL = PairedTolerances({"decode-micro@c2": {"output_tps_p10": Tolerance(0.05)},
                        "official-like@c1": {"ttft_p90": Tolerance(0.10)}}, {})


def runs(n: int = 12, start_sd: float = 0.05, pair_sd: float = 0.05, shift: float = 0.4, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)

    def diffs(offset: float) -> list[float]:
        return list(offset + rng.normal(0, pair_sd, 8))

    return [{"run": i, "start": i // 3, "size": (0.1, 0.2)[i % 2],
             "control": {TPS: diffs(rng.normal(0, start_sd)), TTFT: diffs(rng.normal(0, start_sd))},
             "slowed": {TPS: diffs(shift), TTFT: diffs(0.0)}} for i in range(n)]


def test_tolerances_are_sized_from_the_controls_and_never_below_the_policy():
    noisy = analyse(runs(start_sd=0.08), TOL)["checks"][TPS]
    quiet = analyse(runs(start_sd=0.0, pair_sd=0.001), TOL)["checks"][TPS]
    assert noisy.tolerance.value > 0.10  # 8% between starts needs more than the 5% floor
    assert quiet.tolerance == Tolerance(0.05)  # the floor: the smallest change the policy treats as one


def test_false_alarms_and_detections_are_counted_per_control_and_per_size():
    analysis = analyse(runs(), TOL)
    assert len(analysis["controls"]) == 12
    tps_flagged = {size: sum(v == "regression" for v, _ in analysis["detections"][(size, TPS)]) for size in (0.1, 0.2)}
    assert tps_flagged == {0.1: 6, 0.2: 6}  # a shift of 0.4 (log) is caught every time
    assert not any(v == "regression" for v, _ in analysis["detections"][(0.1, TTFT)])


def test_a_control_far_off_is_a_false_alarm_judged_by_the_others_tolerance():
    results = runs(start_sd=0.01)
    results[5]["control"][TPS] = [0.5 + 0.01 * k for k in range(8)]  # a twin 40% slower
    analysis = analyse(results, TOL)
    alarms = [c["run"] for c in analysis["controls"] if c["false_alarm"]]
    assert alarms == [5]
    assert "A/A false alarms: 1 of 12 controls" in report_markdown(analysis, "test", "m")


def test_an_insufficient_control_counts_as_a_false_alarm():
    results = runs(start_sd=0.0, pair_sd=0.01)
    results[3]["control"][TTFT] = None
    assert [c["run"] for c in analyse(results, TOL)["controls"] if c["false_alarm"]] == [3]


def test_writing_keeps_the_files_comments_and_records_where_it_was_measured(tmp_path):
    path = tmp_path / "paired.yaml"
    path.write_text("# a comment that stays\npairs: 8\npoints: {}\n")
    write_tolerances(analyse(runs(start_sd=0.08), TOL), "qwen36 calibrate --runs 12", "the kind measured on", path)
    text = path.read_text()
    raw = yaml.safe_load(text)
    assert text.startswith("# a comment that stays\n") and raw["pairs"] == 8 and raw["measured"]["pairs"] == 8
    assert raw["points"]["decode-micro@c2"]["output_tps_p10"]["value"] > 0.10
    assert raw["measured"]["runs"] == 12 and raw["measured"]["command"] == "qwen36 calibrate --runs 12"
    assert math.isclose(raw["measured"]["starts"], 4) and raw["measured"]["machine"] == "the kind measured on"


def test_the_machine_is_the_one_the_runs_were_measured_on_not_the_one_analysing_them(tmp_path):
    assert measured_on(tmp_path).startswith("not recorded (analysed on ")
    (tmp_path / MACHINE_FILE).write_text("x86_64, 2 CPUs, AuthenticAMD 25 1\n")
    assert measured_on(tmp_path) == "x86_64, 2 CPUs, AuthenticAMD 25 1"


def test_two_looks_pair_a_control_with_the_next_run_of_its_starts_and_a_slowdown_with_the_next_of_its_size():
    results = runs(start_sd=0.01)
    # start 1's second run: a first-look alarm, 9% worse against a tolerance of about 5%; its confirmation (the
    # next run of start 1) reads 2% better, so the pooled mean (3.4%) is within the tolerance
    results[4]["control"][TPS] = [0.07 + 0.005 * k for k in range(8)]
    results[5]["control"][TPS] = [-0.02 + 0.001 * k for k in range(8)]
    looks = analyse(results, TOL)["two_looks"]
    controls = looks[("control", TPS)]
    assert len(controls) == 8  # 4 starts of 3 runs: 2 look pairs each
    assert sum(f for f, _ in controls) == 1 and sum(c for _, c in controls) == 0
    slowed = looks[(0.2, TPS)]
    assert len(slowed) == 5 and all(f and c for f, c in slowed)  # a 0.4 shift: caught and confirmed every time
    assert "## Two looks" in report_markdown(analyse(results, TOL), "test", "m")


def test_controls_shorter_than_the_gate_size_a_tighter_tolerance_for_it_and_the_file_says_from_what(tmp_path):
    results = runs(start_sd=0.0, pair_sd=0.12)  # 8-pair controls, no offset between starts
    gate16 = PairedTolerances(TOL.points, {}, pairs=16)
    at8, at16 = analyse(results, TOL)["checks"][TPS], analyse(results, gate16)["checks"][TPS]
    assert at16.margin < 0.9 * at8.margin and at16.pairs == 16
    path = tmp_path / "paired.yaml"
    path.write_text("pairs: 16\npoints: {}\n")
    write_tolerances(analyse(results, gate16), "how", "m", path)
    raw = yaml.safe_load(path.read_text())
    assert raw["pairs"] == 16 and raw["measured"]["pairs"] == 8
    spreads = raw["measured"]["spreads"]
    assert set(spreads) == {TPS, TTFT} and spreads[TPS]["pair_sd"] == pytest.approx(0.12, rel=0.15)
    assert spreads[TPS]["offset_bound"] >= spreads[TPS]["offset_sd"]
    assert "its 80% bound" in report_markdown(analyse(results, gate16), "how", "m")
