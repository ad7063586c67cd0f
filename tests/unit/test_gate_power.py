"""CI's paired gates at their 16 pairs: A/A false alarms per CI run, and how often a real 15% change is caught,
simulated from the spreads the tolerances were sized from (fixtures/gates/paired.yaml, `measured.spreads`) with the
gate's own rule (harness.gates.paired.decide_differences) and its confirmation round (harness.gates.confirm).

The model, per check: one start-to-start offset N(0, offset) per CI run, kept through the confirmation round (a
confirmation measures the same two servers again), plus N(0, pair_sd) per pair; a change adds its log size to the
offset. A CI run has two gates that must pass on identical servers (the A/A control and the slower commit,
tests/perf_gates/test_gate_paired.py), each with the four timing checks of paired.yaml (the rates are counts, exact
on identical servers). The checks are drawn independently, which can only overstate how often one of them alarms.

Two machine kinds: the calibrated one (pair spreads as measured), and the noisiest CI has met (every pair spread
scaled so Output TPS P10's is WIDEST_PAIR_SPREAD). Two offsets: the estimate, and the upper bound the tolerances
were sized with.

`python -m tests.unit.test_gate_power` prints the tables of docs/gate-simulation.md.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import yaml
from scipy import special

from harness.gates.gate import FAMILY_ALPHA
from harness.gates.paired import PairedTolerances, decide_differences
from harness.bench.metrics import REGISTRY
from harness.paths import PAIRED_TOLERANCES_FILE
from tests.perf_gates.ci_design import WIDEST_PAIR_SPREAD

TIMED = ("decode-micro@c2:output_tps_p10", "decode-micro@c2:weighted_throughput", "official-like@c1:ttft_p90",
         "official-like@c1:weighted_throughput")
GATES_PER_CI_RUN = 2
CHANGE = 0.15  # the size the gates must resolve: 15% worse
TRIALS = 4000


def measured_spreads() -> dict[str, dict[str, float]]:
    return yaml.safe_load(PAIRED_TOLERANCES_FILE.read_text())["measured"]["spreads"]


def noisiest_scale(spreads: dict) -> float:
    return WIDEST_PAIR_SPREAD / spreads["decode-micro@c2:output_tps_p10"]["pair_sd"]


def worse_by(check: str, change: float = CHANGE) -> float:
    """`change` (a fraction, worse) as the log worsening the pair differences hold."""
    return math.log1p(change) if REGISTRY[check.split(":")[1]].direction == "lower" else -math.log1p(-change)


class Gate:
    def __init__(self):
        self.tolerances = PairedTolerances.load()
        checks = sum(len(metrics) for metrics in self.tolerances.points.values())
        self.alpha = FAMILY_ALPHA / checks
        self.pairs = self.tolerances.pairs

    def margin(self, check: str) -> float:
        point, metric = check.split(":")
        return self.tolerances.tolerance(point, metric).margin(REGISTRY[metric].direction)

    def verdicts(self, rng, check: str, offset_sd: float, pair_sd: float, effect: float) -> tuple[bool, bool]:
        """(flagged by the first look, confirmed) for one gate's check."""
        offset = effect + rng.normal(0, offset_sd)
        first = list(rng.normal(offset, pair_sd, self.pairs))
        if decide_differences(first, self.margin(check), self.alpha)[0] != "regression":
            return False, False
        second = list(rng.normal(offset, pair_sd, self.pairs))
        return True, decide_differences(first + second, self.margin(check), self.alpha)[0] == "regression"


def ci_false_alarms(rng, scale: float, offset_key: str, trials: int = TRIALS) -> tuple[float, float]:
    """(CI runs with a first-look flag, CI runs failed by a confirmed flag), as shares of `trials` CI runs on
    identical servers."""
    gate, spreads = Gate(), measured_spreads()
    flagged = failed = 0
    for _ in range(trials):
        looks = [gate.verdicts(rng, check, spreads[check][offset_key], spreads[check]["pair_sd"] * scale, 0.0)
                 for _ in range(GATES_PER_CI_RUN) for check in TIMED]
        flagged += any(f for f, _ in looks)
        failed += any(c for _, c in looks)
    return flagged / trials, failed / trials


def caught(rng, check: str, scale: float, offset_key: str, change: float = CHANGE,
           trials: int = TRIALS) -> tuple[float, float]:
    """(first look flags, confirmed) shares for a change of `change` on `check`."""
    gate, spread = Gate(), measured_spreads()[check]
    looks = [gate.verdicts(rng, check, spread[offset_key], spread["pair_sd"] * scale, worse_by(check, change))
             for _ in range(trials)]
    return sum(f for f, _ in looks) / trials, sum(c for _, c in looks) / trials


def test_a_ci_run_on_identical_servers_fails_at_most_once_in_thirty_on_the_noisiest_kind():
    spreads = measured_spreads()
    _, failed = ci_false_alarms(np.random.default_rng(1), noisiest_scale(spreads), "offset_bound")
    assert failed <= 1 / 30, f"{failed:.3%} of simulated CI runs on identical servers failed"


def test_on_the_calibrated_kind_a_ci_run_on_identical_servers_fails_far_less():
    _, failed = ci_false_alarms(np.random.default_rng(2), 1.0, "offset_bound")
    assert failed <= 0.015, f"{failed:.3%}"


def test_every_timed_check_catches_a_real_15_percent_change_nine_times_in_ten_on_the_calibrated_kind():
    rng = np.random.default_rng(3)
    # The offset at its estimate: the bound is the pessimism the false alarms are sized with; at the bound TTFT P90,
    # whose tolerance is the policy's 10% floor, catches 15% 0.89 of the time (the tables).
    rates = {check: caught(rng, check, 1.0, "offset_sd", trials=2000)[1] for check in TIMED}
    assert min(rates.values()) >= 0.9, rates


def test_the_confirmation_round_removes_most_first_look_false_alarms():
    flagged, failed = ci_false_alarms(np.random.default_rng(4), noisiest_scale(measured_spreads()), "offset_bound",
                                      trials=2000)
    assert flagged > 2 * failed, (flagged, failed)


def test_the_spreads_the_simulation_reads_are_the_ones_the_tolerances_were_sized_from():
    # `qwen36 calibrate --write` writes both; a hand edit of one without the other would make these tests moot.
    gate, spreads, raw = Gate(), measured_spreads(), yaml.safe_load(PAIRED_TOLERANCES_FILE.read_text())
    controls = raw["measured"]["runs"]
    for check in TIMED:
        s = spreads[check]
        sized = float(special.stdtrit(controls - 1, 1 - gate.alpha)) * math.hypot(
            s["offset_bound"], s["pair_sd"] / math.sqrt(gate.pairs)) * math.sqrt(1 + 1 / controls)
        point, metric = check.split(":")
        floor = gate.tolerances.floor(point, metric).margin(REGISTRY[metric].direction)
        assert gate.margin(check) == pytest.approx(max(sized, floor), rel=2e-3, abs=2e-4), check


def tables() -> str:
    spreads = measured_spreads()
    noisy = noisiest_scale(spreads)
    kinds = (("calibrated kind (pair spreads as measured)", 1.0),
             (f"noisiest kind (pair spreads x{noisy:.2f}: Output TPS P10's {WIDEST_PAIR_SPREAD})", noisy))
    offsets = (("estimate", "offset_sd"), ("sized bound", "offset_bound"))
    lines = [f"CI runs on identical servers, {TRIALS} simulated runs per row (two gates of four timing checks, "
             "each flag measured again):", "",
             "| machine | start offset | runs with a first-look flag | runs failed (confirmed) |",
             "|---|---|---:|---:|"]
    rng = np.random.default_rng(10)
    for kind, scale in kinds:
        for name, key in offsets:
            flagged, failed = ci_false_alarms(rng, scale, key)
            lines.append(f"| {kind} | {name} | {flagged:.2%} | {failed:.2%} |")
    lines += ["", f"A real {CHANGE:.0%} change, {TRIALS} simulated gates per cell, the share confirmed (caught):", "",
              "| check | tolerance | " + " | ".join(f"{k.split(' (')[0]}, offset {o}" for k, _ in kinds for o, _ in offsets)
              + " |", "|---|---:|---:|---:|---:|---:|"]
    gate = Gate()
    for check in TIMED:
        point, metric = check.split(":")
        cells = [f"{caught(rng, check, scale, key)[1]:.1%}" for _, scale in kinds for _, key in offsets]
        lines.append(f"| {check} | {gate.tolerances.tolerance(point, metric).describe()} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(tables())
