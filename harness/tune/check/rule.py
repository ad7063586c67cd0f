"""The GPU perf gate's rule, on numbers alone (no device): is a point slower than its record, did its launches
change, and is the table's choice still the fastest path.

**Times.** A recorded point holds each sweep's median from one or more runs (harness/tune/table/record.py), each run
a separate process, day or machine, in three modes: `eager` (what an eager caller pays: host and GPU), `graph` (a
replay as a caller times it, its launch included) and `gpu` (the GPU's own time, launch hidden). A point is
**slower** when every one of the check's sweeps (at least `MIN_SWEEPS`) is above

    line = (the slowest recorded value) x (1 + tolerance),  tolerance = max(FLOORS[mode], spread)

where `spread` is how far the point's own recorded values differ, (max - min) / min over every sweep of every
run. A point whose values moved 30% between runs gets 30%; one whose sweeps agree within 1% gets the floor.
**Faster** is the mirror rule against the fastest recorded value (reported: re-record to tighten). One noisy
sweep cannot fail a check: a real slowdown moves every sweep, as PyTorch's HUD calls a regression only after
consecutive violating points.

**The floors** cover what the record cannot show yet: the next machine. Each is the smallest floor under which a
second machine's run of the H100 table (2026-12-06, GPU 37b91eac) passed against the first machine's two runs
(GPU c9dfc996), every point judged: graph replay 14% (a 10 us replay is mostly its launch, which differed by up
to 13.6% between the machines, gdn_conv T=64), eager 12% (the host's launch cost: fla_chunk prefill differed by
11.5%). The GPU's own time has no launch in it; its floor, 3%, rests on the replays of 50 us or more, where the
launch is a small part: the second machine lay at most 1.7% beyond the first's runs there (docs/tuning.md).

**Launches.** One eager call's launches and one replay's (kernels, copies, fills on a GPU; ATen ops and Triton
launches on a CPU) are exact: any difference from the latest run that counted them is reported, and one more
launch than recorded fails, naming the block, the point and the count.

The table is **stale** at a point when another path beats its choice by more than `STALE_MARGINS` in every sweep,
the two timed side by side in each sweep: a same-run comparison, so machine-to-machine spread does not enter.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

__all__ = ["FLOORS", "MIN_SWEEPS", "MODES", "STALE_MARGINS", "point_name", "spread", "bounds", "tolerance", "PointVerdict",
           "judge_point", "LaunchVerdict", "judge_launches", "StaleVerdict", "judge_stale", "with_tolerances"]

FLOORS = {"gpu": 0.03, "graph": 0.14, "eager": 0.12}
MODES = ("eager", "graph", "gpu")
# How much faster another path must be, in every sweep of one run, for the table to be worth re-recording (the full
# check): TritonBench's 10% for a replay, 15% for an eager time, which also holds the host's launch cost.
STALE_MARGINS = {"gpu": 0.10, "graph": 0.10, "eager": 0.15}
# one token per sequence, keyed by B
BATCH_KEYED = ("gdn_decode", "gdn_layer_decode", "attention_layer_decode", "decode_step")
MIN_SWEEPS = 3


def point_name(block: str, key: int) -> str:
    """`moe_experts T=8`, `gdn_decode B=1`: decode blocks are keyed by batch, the others by tokens."""
    return f"{block} {'B' if block in BATCH_KEYED else 'T'}={key}"


def spread(values: list[float]) -> float:
    """How far a point's values differ: (max - min) / min; 0 for fewer than two."""
    return (max(values) - min(values)) / min(values) if len(values) > 1 and min(values) > 0 else 0.0


def tolerance(recorded: list[float], mode: str) -> float:
    """How far beyond its recorded envelope a point may move: the mode's floor, or the point's own spread."""
    return max(FLOORS[mode], spread(recorded))


def with_tolerances(timings: dict) -> dict:
    """A table's `timings` with each point's tolerance per mode, from every value recorded for it (written for the
    reader of the table; the gate recomputes it)."""
    def annotated(point: dict) -> dict:
        values = {mode: [v for e in point["runs"] for v in e.get(f"{mode}_us") or []] for mode in MODES}
        return {**point, "tolerance": {mode: round(tolerance(v, mode), 4) for mode, v in values.items() if v}}

    return {**timings, "points": [annotated(p) for p in timings.get("points", [])]}


def bounds(recorded: list[float], mode: str) -> tuple[float, float]:
    """(faster below, slower above): the recorded envelope widened by the point's tolerance."""
    tol = tolerance(recorded, mode)
    return min(recorded) / (1 + tol), max(recorded) * (1 + tol)


@dataclass(frozen=True)
class PointVerdict:
    block: str
    key: int
    path: str
    mode: str
    status: str  # pass | slower | faster | unrecorded | too-few-sweeps
    recorded_us: float | None
    measured_us: float | None  # median of the check's sweeps
    tolerance: float | None  # the point's, on the slowest recorded value
    measured_sweeps_us: tuple[float, ...] = ()
    recorded_values: int = 0
    gated: bool = True  # False: reported only (a mode the table does not rank by; see harness/tune/check/run.py)

    @property
    def ratio(self) -> float | None:
        if self.recorded_us and self.measured_us is not None:
            return self.measured_us / self.recorded_us
        return None

    line_us: float | None = None  # slower above this

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
        why = "floor" if self.tolerance <= FLOORS[self.mode] else "its recorded spread"
        return (f"{head}: {where}: recorded {self.recorded_us:,.1f} us, measured {self.measured_us:,.1f} us "
                f"(x{self.ratio:.3f}; sweeps {sweeps}); slower above {self.line_us:,.1f} us: the slowest of "
                f"{self.recorded_values} recorded values + {self.tolerance:.1%} ({why})")

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
                        tolerance(recorded, mode), measured, len(recorded), gated, high)


@dataclass(frozen=True)
class LaunchVerdict:
    block: str
    key: int
    path: str
    mode: str  # eager (one call) | graph (one replay)
    status: str  # same | more | fewer | changed (some kinds more, some fewer) | unrecorded
    recorded: dict | None
    measured: dict

    @property
    def failed(self) -> bool:
        return self.status in ("more", "changed")

    def line(self) -> str:
        where = f"{point_name(self.block, self.key)} {self.path} ({'one replay' if self.mode == 'graph' else 'one call'})"
        counts = lambda c: ", ".join(f"{n} {kind}" for kind, n in c.items())  # noqa: E731
        if self.status == "unrecorded":
            return f"launches of {where}: {counts(self.measured)}; none recorded"
        if self.status == "same":
            return f"launches same: {where}: {counts(self.measured)}"
        diff = ", ".join(f"{kind} {self.recorded.get(kind, 0)} -> {n}" for kind, n in self.measured.items()
                         if n != self.recorded.get(kind, 0))
        head = {"more": "MORE LAUNCHES", "changed": "LAUNCHES CHANGED", "fewer": "fewer launches"}[self.status]
        return f"{head}: {where}: {diff} (recorded {counts(self.recorded)})"

    def as_dict(self) -> dict:
        return {**asdict(self), "failed": self.failed, "line": self.line()}


def judge_launches(block: str, key: int, path: str, mode: str, recorded: dict | None,
                   measured: dict) -> LaunchVerdict:
    """Exact: the same counts pass; any kind above its record fails ("more", or "changed" where another kind
    fell); all at or below, one below, is "fewer" (reported: re-record)."""
    if not recorded:
        return LaunchVerdict(block, key, path, mode, "unrecorded", None, dict(measured))
    kinds = set(recorded) | set(measured)
    up = any(measured.get(k, 0) > recorded.get(k, 0) for k in kinds)
    down = any(measured.get(k, 0) < recorded.get(k, 0) for k in kinds)
    status = "changed" if up and down else "more" if up else "fewer" if down else "same"
    return LaunchVerdict(block, key, path, mode, status, dict(recorded), dict(measured))


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
