"""Which upper bound of the start-to-start offset to size the paired tolerances with: false alarms against detection.

For each bound (the estimate, and upper confidence bounds from resampling whole server starts) it sizes the four
timing checks' tolerances from the calibration's A/A controls for a 16-pair gate, then simulates with the gate's
rule and its confirmation round (as tests/unit/test_gate_power.py does): a CI run on identical servers (two gates
of four checks) with the true offset at its estimate and at its 90% bound, on the calibrated kind and on the
noisiest (pair spreads scaled so Output TPS P10's is 0.27); and a real 15% change on the calibrated kind.

    PYTHONPATH=. .venv/bin/python tools/offset_bound_tradeoff.py reports/gate-power-2026-12-06/calibration-reanalysed
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from harness.bench.metrics import REGISTRY
from harness.gates.evidence.calibrate import load_results
from harness.gates.gate import FAMILY_ALPHA
from harness.gates.paired import PairedTolerances, control_spread, decide_differences, margin_for_pairs
from tests.perf_gates.ci_design import WIDEST_PAIR_SPREAD

TIMED = ("decode-micro@c2:output_tps_p10", "decode-micro@c2:weighted_throughput", "official-like@c1:ttft_p90",
         "official-like@c1:weighted_throughput")
PAIRS, CONTROLS_CHECKS = 16, 7


def flagged(rng, offset_sd, pair_sd, effect, margin, alpha) -> bool:
    offset = effect + rng.normal(0, offset_sd)
    first = list(rng.normal(offset, pair_sd, PAIRS))
    if decide_differences(first, margin, alpha)[0] != "regression":
        return False
    return decide_differences(first + list(rng.normal(offset, pair_sd, PAIRS)), margin, alpha)[0] == "regression"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibration", type=Path)
    ap.add_argument("--trials", type=int, default=8000)
    a = ap.parse_args(argv)
    results, tolerances = load_results(a.calibration), PairedTolerances.load()
    alpha = FAMILY_ALPHA / CONTROLS_CHECKS
    data = {c: ([r["control"][c] for r in results], [r["start"] for r in results]) for c in TIMED}
    spread = {c: control_spread(*data[c]) for c in TIMED}
    true90 = {c: control_spread(*data[c], bound=0.9).offset_bound for c in TIMED}
    noisy = WIDEST_PAIR_SPREAD / spread[TIMED[0]].pair_sd
    rng = np.random.default_rng(0)
    print("| offset sized at | tolerances (TPS P10, WT decode, TTFT P90, WT official) | CI fails, offset at estimate: "
          "calibrated / noisiest | offset at its 90% bound: calibrated / noisiest | 15% caught, calibrated |")
    print("|---|---|---:|---:|---|")
    for bound in (None, 0.5, 0.8, 0.9):
        margins, described = {}, []
        for c in TIMED:
            point, metric = c.split(":")
            direction = REGISTRY[metric].direction
            sized = margin_for_pairs(data[c][0], alpha, PAIRS, None if bound is None else data[c][1], bound or 0.5)
            margins[c] = max(sized, tolerances.floor(point, metric).margin(direction))
            described.append(f"{(math.expm1(margins[c]) if direction == 'lower' else -math.expm1(-margins[c])):.1%}")
        cells = []
        for offsets in ({c: spread[c].offset_sd for c in TIMED}, true90):
            for scale in (1.0, noisy):
                fails = sum(any(flagged(rng, offsets[c], spread[c].pair_sd * scale, 0.0, margins[c], alpha)
                                for _ in range(2) for c in TIMED) for _ in range(a.trials))
                cells.append(f"{fails / a.trials:.2%}")
        caught = [sum(flagged(rng, spread[c].offset_sd, spread[c].pair_sd, _worse15(c), margins[c], alpha)
                      for _ in range(a.trials // 4)) / (a.trials // 4) for c in TIMED]
        print(f"| {'estimate' if bound is None else f'{bound:.0%} bound'} | {', '.join(described)} | "
              f"{cells[0]} / {cells[1]} | {cells[2]} / {cells[3]} | {', '.join(f'{x:.1%}' for x in caught)} |")
    return 0


def _worse15(check: str) -> float:
    return math.log(1.15) if REGISTRY[check.split(":")[1]].direction == "lower" else -math.log(0.85)


if __name__ == "__main__":
    sys.exit(main())
