"""The slowdowns CI's paired perf gates inject, and the measurements that size them.

Shared by the timing run that injects them (test_gate_paired.py) and the unit test that checks, without a server,
that the gate's design catches them at the widest spread CI has met (tests/unit/test_gate_paired.py).

Why these sizes: the tests that must flag prove the gate catches a slower server on every kind of machine CI lands
on, so their slowdown must be caught nearly always even on the noisiest kind; what the gate resolves at smaller
sizes is measured per kind by `qwen36 calibrate` (docs/perf-gates.md). At 0.4 and 8 pairs the slower decode was
missed on 2026-12-05 (Output TPS P10 -24.6%, p 0.0079 against 0.0071) on a run whose A/A pairs spread 0.27.
"""
from __future__ import annotations

DECODE_POINT, PREFILL_POINT = "decode-micro@c2", "official-like@c1"
# The injected regressions, as step slowdowns of the twin (patches/model_paths/step_slowdown.py: a step takes 1 + f
# times as long).
DECODE_SLOWDOWN = 1.0
PREFILL_SLOWDOWN = 1.0
# What each must-flag test requires flagged: the metrics its slowdown moves.
MUST_FLAG = {"slower-decode": {(DECODE_POINT, "output_tps_p10"), (DECODE_POINT, "weighted_throughput")},
             "slower-prefill": {(PREFILL_POINT, "ttft_p90")}}
# The widest spread of A/A pair log ratios a CI run has shown: Output TPS P10, the session's server against its
# twin, 0.269 (CI of 2026-12-05, AMD EPYC family 23 model 1; reports/perf-gates-2026-12-05.md).
WIDEST_PAIR_SPREAD = 0.27
# Per must-flag check, the share of its time that a step slowdown stretches: at slowdown f the metric is worse by
# the factor 1 + f * share. The smallest of five CI runs at f = 0.4 on 2026-12-05 (the report): Output TPS P10
# -20.3%, weighted throughput -16.2%, TTFT P90 +32.7%, so 1 / (1 - 0.203) = 1 + 0.4 * 0.637 and so on.
STEP_SHARE = {(DECODE_POINT, "output_tps_p10"): 0.637,
              (DECODE_POINT, "weighted_throughput"): 0.483,
              (PREFILL_POINT, "ttft_p90"): 0.817}


def slowdown_of(point: str) -> float:
    return DECODE_SLOWDOWN if point == DECODE_POINT else PREFILL_SLOWDOWN


def slowed(point: str) -> str:
    """The twin's slowdown text (patches/model_paths/step_slowdown.py) for its blocks at `point`."""
    return f"decode={DECODE_SLOWDOWN}" if point.startswith("decode") else f"prefill={PREFILL_SLOWDOWN}"
