"""The GPU perf gate's rule, on numbers alone (no device): is a point slower than its record, and is the
table's choice still the fastest path.

A recorded point holds each sweep's median from one or more runs (harness/tune/table/record.py), each run a separate
process, day or machine. A point is **slower** when every one of the check's sweeps (at least `MIN_SWEEPS`) is
slower than the slowest recorded value by more than the mode's floor; **faster** by the mirror rule, against
the fastest recorded value (reported: re-record to tighten). So a point whose time moves between machines is
gated above everything recorded for it, and a steady one at its floor; a spread is never doubled.

Floors follow the field: TritonBench gates at 10% with locked clocks; an eager time also holds the host's
launch cost, which moves more (15%). Every sweep must agree, as PyTorch's HUD calls a regression only after
consecutive violating points: one noisy sweep cannot fail a check, a real slowdown moves every sweep.

The table is **stale** at a point when another path beats its choice by more than the floor in every sweep,
the two timed side by side in each sweep: a same-run comparison, so machine-to-machine spread does not enter.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

__all__ = ["FLOORS", "MIN_SWEEPS", "point_name", "bounds", "tolerance", "PointVerdict", "judge_point",
           "StaleVerdict", "judge_stale"]

FLOORS = {"graph": 0.10, "eager": 0.15}
# one token per sequence, keyed by B
BATCH_KEYED = ("gdn_decode", "gdn_layer_decode", "attention_layer_decode", "decode_step")
MIN_SWEEPS = 3


def point_name(block: str, key: int) -> str:
    """`moe_experts T=8`, `gdn_decode B=1`: decode blocks are keyed by batch, the others by tokens."""
    return f"{block} {'B' if block in BATCH_KEYED else 'T'}={key}"


def bounds(recorded: list[float], mode: str) -> tuple[float, float]:
    """(faster below, slower above): the recorded envelope widened by the mode's floor."""
    floor = FLOORS[mode]
    return min(recorded) / (1 + floor), max(recorded) * (1 + floor)


def tolerance(recorded: list[float], mode: str) -> float:
    """The slowdown against the recorded median that a point may show before it counts (for reports)."""
    return bounds(recorded, mode)[1] / statistics.median(recorded) - 1


@dataclass(frozen=True)
class PointVerdict:
    block: str
    key: int
    path: str
    mode: str
    status: str  # pass | slower | faster | unrecorded | too-few-sweeps
    recorded_us: float | None
    measured_us: float | None  # median of the check's sweeps
    tolerance: float | None
    measured_sweeps_us: tuple[float, ...] = ()
    recorded_values: int = 0
    gated: bool = True  # False: reported only (a mode the table does not rank by; see harness/tune/check/run.py)

    @property
    def ratio(self) -> float | None:
        if self.recorded_us and self.measured_us is not None:
            return self.measured_us / self.recorded_us
        return None

    @property
    def failed(self) -> bool:
        return self.gated and self.status in ("slower", "too-few-sweeps")

    def line(self) -> str:
        where = f"{point_name(self.block, self.key)} {self.path} ({self.mode})"
        if self.status == "unrecorded":
            return f"{where}: not in the table's timings (measured {self.measured_us:,.1f} us); nothing to compare"
        sweeps = ", ".join(f"{v:,.1f}" for v in self.measured_sweeps_us)
        head = {"pass": "pass", "slower": "SLOWER", "faster": "faster", "too-few-sweeps": "TOO FEW SWEEPS"}[self.status]
        if not self.gated:
            head = f"{head.lower()} (not gated)"
        return (f"{head}: {where}: recorded {self.recorded_us:,.1f} us, measured {self.measured_us:,.1f} us "
                f"(x{self.ratio:.3f}; sweeps {sweeps}); slower above x{1 + self.tolerance:.3f}: the slowest of "
                f"{self.recorded_values} recorded values + {FLOORS[self.mode]:.0%}")

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "line": self.line()}


def judge_point(block: str, key: int, path: str, mode: str, recorded: list[float],
                measured_sweeps: list[float], gated: bool = True) -> PointVerdict:
    measured = tuple(measured_sweeps)
    mid = statistics.median(measured) if measured else None
    if not recorded:
        return PointVerdict(block, key, path, mode, "unrecorded", None, mid, None, measured, 0, gated)
    low, high = bounds(recorded, mode)
    if len(measured) < MIN_SWEEPS:
        status = "too-few-sweeps"
    elif all(v > high for v in measured):
        status = "slower"
    elif all(v < low for v in measured):
        status = "faster"
    else:
        status = "pass"
    return PointVerdict(block, key, path, mode, status, statistics.median(recorded), mid,
                        tolerance(recorded, mode), measured, len(recorded), gated)


@dataclass(frozen=True)
class StaleVerdict:
    block: str
    key: int
    mode: str
    chosen: str
    chosen_us: float
    best: str
    best_us: float
    tolerance: float
    stale: bool

    def line(self) -> str:
        where = point_name(self.block, self.key)
        if not self.stale:
            return (f"ok: {where}: the table's {self.chosen} ({self.chosen_us:,.1f} us, "
                    f"{self.mode}) is fastest or within {self.tolerance:.0%} of {self.best} ({self.best_us:,.1f} us)")
        return (f"STALE: {where}: {self.best} takes {self.best_us:,.1f} us against the "
                f"table's {self.chosen} {self.chosen_us:,.1f} us ({self.mode}, x{self.chosen_us / self.best_us:.2f}, "
                f"beyond {self.tolerance:.0%} in every sweep)")

    def as_dict(self) -> dict:
        return {**asdict(self), "line": self.line()}


def judge_stale(block: str, key: int, mode: str, chosen: str, times: dict[str, list[float]],
                tol: float) -> StaleVerdict:
    """`times`: path -> its sweep medians, sweep j of every path timed in the same pass. Stale when some other
    path is faster than the choice by more than `tol` in every sweep."""
    mine = times[chosen]
    median_of = {p: statistics.median(v) for p, v in times.items() if v}
    best = min(median_of, key=median_of.get)
    beaten_by = [p for p, v in times.items() if p != chosen and len(v) == len(mine) and v
                 and all(c > o * (1 + tol) for c, o in zip(mine, v))]
    if beaten_by:
        best = min(beaten_by, key=median_of.get)
    return StaleVerdict(block, key, mode, chosen, median_of[chosen], best, median_of[best], tol, bool(beaten_by))
