"""The confirmation round (harness.gates.confirm): a flagged check fails only if the first look's pairs pooled with
a second round's still flag it. Its rule on written runs, its wiring (which arms and points it measures again),
and a seeded simulation of what it does to false alarms and to detection."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from harness.bench.run import PRESETS
from harness.gates import confirm as confirm_module
from harness.gates.confirm import ConfirmedVerdict, confirm, only_points
from harness.gates.decision import Tolerance
from harness.gates.interleave import Arm, InterleavedRun
from harness.gates.paired import PairedTolerances, decide_differences, paired_gate
from harness.serving.shared_server import ServerInfo
from tests.unit.test_gate_paired import write_interleaved

POINT = "decode-micro@c2"
TOL = PairedTolerances({POINT: {"output_tps_p10": Tolerance(0.05)}}, {})
ONLY = {POINT: ("output_tps_p10",)}
BASE = (300, 280, 310, 290, 305, 295)


def blocks(factors) -> list[dict]:
    return [{"output_tps_p10": v * f} for v, f in zip(BASE, factors)]


SLOWER = blocks([0.8, 0.81, 0.79, 0.8, 0.82, 0.8])
SAME = blocks([1.01, 0.99, 1.0, 1.02, 0.98, 1.0])
MODEST = blocks([0.93, 0.94, 0.93, 0.94, 0.93, 0.93])  # 6.7% slower: beyond a 5% tolerance, not twice it
REFERENCE = blocks([1.0] * 6)


def first_look(tmp_path: Path, b_blocks: list[dict]):
    return paired_gate(write_interleaved(tmp_path / "first", REFERENCE, b_blocks), "session", "twin", TOL, ONLY)


def test_pooled_runs_number_their_pairs_on_and_decide_on_all_of_them(tmp_path):
    one = write_interleaved(tmp_path / "one", REFERENCE, SLOWER)
    two = write_interleaved(tmp_path / "two", REFERENCE, SAME)
    pooled = paired_gate([one, two], "session", "twin", TOL, ONLY)
    row = pooled.row(POINT, "output_tps_p10")
    assert pooled.pairs == 12 and len(row.differences) == 12
    assert row.differences[:6] == paired_gate(one, "session", "twin", TOL, ONLY).row(POINT, "output_tps_p10").differences
    assert pooled.excluded[POINT]["b"] == [0] * 12


def test_a_first_look_that_passes_is_not_measured_again(tmp_path):
    verdict = ConfirmedVerdict(first_look(tmp_path, SAME))
    assert verdict.passed and not verdict.needs_confirmation


def test_a_flag_the_second_round_does_not_repeat_passes_when_pooled(tmp_path):
    first = first_look(tmp_path, MODEST)
    assert first.regressions
    pooled = paired_gate([Path(first.path), write_interleaved(tmp_path / "second", REFERENCE, SAME)], "session",
                         "twin", TOL, ONLY)
    verdict = ConfirmedVerdict(first, pooled)
    assert verdict.passed and verdict.regressions == [], verdict.markdown()
    assert "Confirmed regressions (flagged by both): none" in verdict.markdown()


def test_a_regression_that_holds_in_the_second_round_fails_naming_the_check(tmp_path):
    first = first_look(tmp_path, SLOWER)
    pooled = paired_gate([Path(first.path), write_interleaved(tmp_path / "second", REFERENCE, SLOWER)], "session",
                         "twin", TOL, ONLY)
    verdict = ConfirmedVerdict(first, pooled)
    assert not verdict.passed
    assert [(r.point, r.metric) for r in verdict.regressions] == [(POINT, "output_tps_p10")]
    assert f"flagged by both): {POINT} output_tps_p10" in verdict.markdown() and "**FAIL**" in verdict.markdown()


def test_a_check_flagged_only_by_the_pooled_pairs_is_not_a_confirmed_regression(tmp_path):
    # The rule is first AND pooled: a pooled flag alone is not a first-look flag confirmed.
    first = first_look(tmp_path, SAME)
    pooled = paired_gate([Path(first.path), write_interleaved(tmp_path / "second", REFERENCE, SLOWER)], "session",
                         "twin", TOL, ONLY)
    assert pooled.regressions and ConfirmedVerdict(first, pooled).passed


def test_an_insufficient_first_look_fails_at_once_without_a_second_round(tmp_path):
    b = SLOWER[:5] + [{"output_tps_p10": 240, "stalled_excluded": 9}]
    verdict = ConfirmedVerdict(first_look(tmp_path, b))
    assert not verdict.needs_confirmation and not verdict.passed


def test_only_points_keeps_the_flagged_points_of_a_preset():
    cut = only_points(PRESETS["paired"], {"official-like@c1"})
    assert [(w.dataset, w.concurrencies) for w in cut] == [("official-like", (1,))]
    assert only_points(PRESETS["paired"], set()) == ()


def test_confirm_measures_the_two_arms_again_on_the_flagged_points_only(tmp_path, monkeypatch):
    first = first_look(tmp_path, SLOWER)
    calls = []

    def fake_interleave(arms, workloads, rounds, out_root, label, **kwargs):
        calls.append(([a.label for a in arms], [(w.dataset, w.concurrencies) for w in workloads], rounds, label))
        return InterleavedRun(write_interleaved(tmp_path / "second", REFERENCE, SLOWER), rounds, "completed")

    monkeypatch.setattr(confirm_module, "interleave", fake_interleave)
    server = ServerInfo("http://127.0.0.1:1", "m")
    arms = {label: Arm(label, server) for label in ("session", "twin", "twin-slowed")}
    verdict = confirm(first, arms, PRESETS["paired"], 6, tmp_path, TOL)
    assert calls == [(["session", "twin"], [("decode-micro", (2,))], 6, "confirm-twin-against-session")]
    assert not verdict.passed and verdict.pooled is not None and verdict.pooled.pairs == 12


def test_confirm_does_not_measure_a_passing_first_look(tmp_path, monkeypatch):
    monkeypatch.setattr(confirm_module, "interleave", lambda *a, **k: pytest.fail("measured a passing first look"))
    assert confirm(first_look(tmp_path, SAME), {}, PRESETS["paired"], 6, tmp_path, TOL).pooled is None


# The simulation: pairs share a start offset N(0, START_SD) between the two servers that persists through both
# rounds (a confirmation re-measures the same servers), plus N(0, PAIR_SD) per pair; the margin is fixed at what
# a tolerance sized from A/A controls of this spread would be.
PAIRS, PAIR_SD, START_SD, ALPHA, TRIALS = 8, 0.10, 0.027, 0.05 / 7, 4000


def looks(rng, shift: float, margin: float) -> tuple[int, int]:
    """(first-look flags, confirmed flags) over TRIALS on identical (shift 0) or slower (shift > 0) servers."""
    first = confirmed = 0
    for _ in range(TRIALS):
        offset = shift + rng.normal(0, START_SD)
        d1, d2 = list(rng.normal(offset, PAIR_SD, PAIRS)), list(rng.normal(offset, PAIR_SD, PAIRS))
        if decide_differences(d1, margin, ALPHA)[0] == "regression":
            first += 1
            confirmed += decide_differences(d1 + d2, margin, ALPHA)[0] == "regression"
    return first, confirmed


def sim_margin() -> float:
    # The control means' spread (start offset and a mean's sampling error) at the margin's quantile, as
    # margin_from_controls sizes it from many controls.
    from scipy import stats
    return float(stats.norm.ppf(1 - ALPHA)) * math.hypot(START_SD, PAIR_SD / math.sqrt(PAIRS))


def test_simulated_false_alarms_fall_to_a_fraction_of_the_first_looks():
    first, confirmed = looks(np.random.default_rng(11), 0.0, sim_margin())
    assert first > 0, "the simulation must produce first-look false alarms for the rule to act on"
    assert confirmed <= first / 2, f"{confirmed} of {first} first-look false alarms confirmed"


def test_simulated_detection_of_twice_the_tolerance_stays_nine_in_ten():
    margin = sim_margin()
    first, confirmed = looks(np.random.default_rng(12), 2 * margin, margin)
    assert first / TRIALS >= 0.9 and confirmed / TRIALS >= 0.9, (first, confirmed)


@pytest.mark.parametrize(("first", "second", "exit_code"), [(MODEST, SAME, 0), (SLOWER, SLOWER, 1)])
def test_qwen36_ab_exits_on_the_confirmed_verdict(tmp_path, monkeypatch, capsys, first, second, exit_code):
    # `qwen36 ab --a URL --b URL` with the measurement replaced by written runs: the first look flags B, and the
    # confirmation round decides the exit status (0: not confirmed, 1: confirmed, as EXIT_REGRESSION).
    from harness.bench import run as bench_run
    from harness.cli import main
    from harness.gates import interleave as interleave_module

    runs = iter([("first", first), ("second", second)])

    def fake_interleave(arms, workloads, rounds, out_root, label, **kwargs):
        name, b_blocks = next(runs)
        path = write_interleaved(tmp_path / name, REFERENCE, b_blocks)
        for arm, side in (("session", "A"), ("twin", "B")):
            (path / arm).rename(path / side)
        meta = json.loads((path / "rounds.json").read_text())
        (path / "rounds.json").write_text(json.dumps({**meta, "arms": {"A": "u1", "B": "u2"}}))
        return InterleavedRun(path, rounds, "completed")

    monkeypatch.setattr(bench_run, "list_models", lambda url, key=None: ["m"])
    monkeypatch.setattr(interleave_module, "interleave", fake_interleave)
    monkeypatch.setattr(confirm_module, "interleave", fake_interleave)
    monkeypatch.setattr(PairedTolerances, "load", classmethod(lambda cls, path=None: TOL))
    code = main(["ab", "--a", "http://127.0.0.1:1", "--b", "http://127.0.0.1:2", "--out", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert code == exit_code, out
    assert "Confirmation" in out and (tmp_path / "first" / "confirmed" / "gate.md").exists()
