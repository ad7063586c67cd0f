"""The two costs every host figure is read against, measured in the same run as the points: one ATen op's host
time per call, and the timer's own cost.

- One ATen op: `torch.add` of two [1, 2048] tensors in the run's dtype (one elementwise kernel on a GPU), host
  microseconds per call over back-to-back calls (measure/timing.py `host_us_per_call`), and timed as the gate
  times an eager call. A block's host time is reported as a multiple of it: machines differ in host speed, the
  ratio says what the block's own code costs.
- The timer: an empty call timed exactly as an eager call is (flush, synchronise, start event, the call, end
  event): what every eager figure holds that is not the call's.
"""
from __future__ import annotations

import statistics

import torch

from .timing import L2Flusher, host_us_per_call, time_eager

__all__ = ["ATEN_OP", "call_costs", "merged_costs"]

ATEN_OP = "torch.add of two [1, 2048] tensors"
CALLS = 2000


def call_costs(device: torch.device, dtype: torch.dtype, flusher: L2Flusher, reps: int) -> dict:
    a = torch.randn(1, 2048, device=device).to(dtype)
    b = torch.randn(1, 2048, device=device).to(dtype)

    def add():
        return torch.add(a, b)

    eager = time_eager(add, device, flusher, reps, warmup=10)
    host = host_us_per_call(add, device, CALLS)
    timer = time_eager(lambda: None, device, flusher, reps, warmup=3)
    return {"aten_op": f"{ATEN_OP} ({str(dtype).removeprefix('torch.')})", "aten_op_host_us": round(host, 3),
            "aten_op_eager_us": round(eager.median_us, 3), "timer_us": round(timer.median_us, 3)}


def merged_costs(costs: list[dict]) -> dict | None:
    """One run's call costs from each sweep's: the median of each figure (None when none was measured)."""
    if not costs:
        return None
    numbers = [k for k, v in costs[0].items() if isinstance(v, (int, float))]
    return {**costs[0], **{k: round(statistics.median(c[k] for c in costs), 3) for k in numbers},
            "measured": len(costs)}
