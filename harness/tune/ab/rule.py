"""The A/B rule of `qwen36 tune --ab`, on numbers alone (no device): is this checkout (head) slower than the
reference (ref) at a point, the two timed in the same run, and does it launch more.

Each sweep times a point on both sides back to back, so sweep j's ratio head/ref compares two times taken
seconds apart on the same clocks. Head is **slower** when every sweep's ratio is above 1 + tolerance, and
**faster** when every one is below 1 / (1 + tolerance): one noisy sweep cannot fail an A/B, a real slowdown
moves every sweep (the gate's rule, harness/tune/check/rule.py, with the reference measured now instead of
recorded). The tolerance is the point's own noise in this run, the larger spread of either side's sweeps
((max - min) / min), or the mode's floor where the sweeps agree more closely than it: both sides share the machine
and the hour, so only what moves between two processes on it enters the floor. The floors (`AB_FLOORS`): the
H100 table's two runs on one machine (2026-12-06, two processes, minutes apart) moved the decode step's replay by
0.07% and its sweeps by at most 0.25%, so 2% for the GPU's own time and the replay; eager holds the host's cost,
3%, with each side's own sweep spread above it. A wrong output, an error or a path that cannot run on either side fails the point whatever the times say;
so does head launching more than ref in one call or one replay (counted in the first sweep, exact).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

from ..check.rule import MIN_SWEEPS, judge_launches, point_name, spread

__all__ = ["SideSweeps", "ABVerdict", "judge_ab", "MODES", "AB_FLOORS"]

MODES = ("eager", "graph", "gpu")
AB_FLOORS = {"gpu": 0.02, "graph": 0.02, "eager": 0.03}
# The check's launch verdicts (check/rule.py judge_launches), as the A/B names them.
LAUNCH_STATUS = {"same": "same launches", "more": "more launches", "fewer": "fewer launches",
                 "changed": "launches changed"}
FAILING = ("slower", "too-few-sweeps", "wrong", "error", "missing", "more launches", "launches changed")


@dataclass(frozen=True)
class SideSweeps:
    """One side's results at one point: its worst status over the sweeps and each sweep's median per mode
    (None where that sweep has no time in that mode, e.g. a graph that was not captured)."""
    status: str  # ok | wrong | error | missing (the point did not run on this side)
    detail: str = ""
    eager_us: Sequence[float | None] = ()
    graph_us: Sequence[float | None] = ()
    graph_note: str = ""
    gpu_us: Sequence[float | None] = ()  # the GPU's own time, launch hidden
    launches: dict | None = None  # one call's, where counted
    graph_launches: dict | None = None  # one replay's

    def sweeps(self, mode: str) -> Sequence[float | None]:
        return {"eager": self.eager_us, "graph": self.graph_us, "gpu": self.gpu_us}[mode]


@dataclass(frozen=True)
class ABVerdict:
    block: str
    key: int
    path: str
    mode: str  # eager | graph | gpu | launches (one call) | graph launches (one replay) | "" (a broken side)
    status: str  # pass | slower | faster | too-few-sweeps | wrong | error | missing | unpaired | same launches |
    #              more launches | fewer launches | launches changed
    ref_us: float | None = None  # median of the paired sweeps
    head_us: float | None = None
    ratios: tuple[float, ...] = ()  # head / ref, sweep by sweep
    tolerance: float | None = None
    side: str = ""  # for wrong, error, missing, unpaired: the side that has the problem
    detail: str = ""

    @property
    def ratio(self) -> float | None:
        return self.head_us / self.ref_us if self.head_us is not None and self.ref_us else None

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    def where(self) -> str:
        mode = f" ({self.mode})" if self.mode else ""
        return f"{point_name(self.block, self.key)} {self.path}{mode}"

    def line(self) -> str:
        if "launches" in self.status:
            head = self.status.upper() if self.failed else self.status
            return f"{head}: {self.where()}: {self.detail}"
        if self.status in ("wrong", "error", "missing", "unpaired"):
            head = "not paired" if self.status == "unpaired" else self.status.upper()
            return f"{head} on {self.side}: {self.where()}: {self.detail}"
        head = {"pass": "pass", "slower": "SLOWER", "faster": "faster", "too-few-sweeps": "TOO FEW SWEEPS"}[self.status]
        sweeps = ", ".join(f"x{r:.3f}" for r in self.ratios)
        if self.ref_us is None:
            return f"{head}: {self.where()}: no sweep timed on both sides (need {MIN_SWEEPS})"
        text = (f"{head}: {self.where()}: ref {self.ref_us:,.1f} us, head {self.head_us:,.1f} us "
                f"(x{self.ratio:.3f}; sweeps {sweeps}); tolerance {self.tolerance:.0%}")
        return text + (f"; {len(self.ratios)} paired sweeps, need {MIN_SWEEPS}" if self.status == "too-few-sweeps"
                       else "")

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "failed": self.failed, "line": self.line()}


def _broken(block: str, key: int, path: str, head: SideSweeps, ref: SideSweeps) -> list[ABVerdict]:
    return [ABVerdict(block, key, path, "", side.status, side=name, detail=side.detail or "(no detail)")
            for name, side in (("head", head), ("ref", ref)) if side.status != "ok"]


def _judge_launches(block: str, key: int, path: str, head: SideSweeps, ref: SideSweeps) -> list[ABVerdict]:
    out = []
    for mode, h, r in (("launches", head.launches, ref.launches),
                       ("graph launches", head.graph_launches, ref.graph_launches)):
        if not h or not r:
            continue
        status = LAUNCH_STATUS[judge_launches(block, key, path, mode, r, h).status]
        counts = ", ".join(f"{kind} {r.get(kind, 0)} -> {n}" for kind, n in h.items())
        out.append(ABVerdict(block, key, path, mode, status, detail=f"ref -> head: {counts}"))
    return out


def tolerance(mode: str, head: Sequence[float], ref: Sequence[float], floors: Mapping[str, float]) -> float:
    """The mode's floor, or the larger spread of the two sides' sweeps in this run."""
    return max(floors[mode], spread(list(head)), spread(list(ref)))


def _judge_mode(block: str, key: int, path: str, mode: str, head: SideSweeps, ref: SideSweeps,
                floors: Mapping[str, float], min_sweeps: int) -> ABVerdict | None:
    h, r = head.sweeps(mode), ref.sweeps(mode)
    has_head, has_ref = any(v is not None for v in h), any(v is not None for v in r)
    if not has_head and not has_ref:
        return None  # not timed in this mode on either side (no graphs here, or --no-graph)
    if has_head != has_ref:
        # Head losing a graph replay the reference has is a regression; head gaining one is not.
        lacking, why = ("head", head.graph_note) if not has_head else ("ref", ref.graph_note)
        return ABVerdict(block, key, path, mode, "missing" if lacking == "head" else "unpaired", side=lacking,
                         detail=f"no {mode} time on {lacking}: {why or 'not measured'}")
    pairs = [(hv, rv) for hv, rv in zip(h, r) if hv is not None and rv is not None and rv > 0]
    ratios = tuple(hv / rv for hv, rv in pairs)
    tol = tolerance(mode, [hv for hv, _ in pairs], [rv for _, rv in pairs], floors)
    ref_us = statistics.median(rv for _, rv in pairs) if pairs else None
    head_us = statistics.median(hv for hv, _ in pairs) if pairs else None
    if len(pairs) < min_sweeps:
        status = "too-few-sweeps"
    elif all(x > 1 + tol for x in ratios):
        status = "slower"
    elif all(x * (1 + tol) < 1 for x in ratios):
        status = "faster"
    else:
        status = "pass"
    return ABVerdict(block, key, path, mode, status, ref_us, head_us, ratios, tol)


def judge_ab(block: str, key: int, path: str, head: SideSweeps, ref: SideSweeps,
             floors: Mapping[str, float] = AB_FLOORS, min_sweeps: int = MIN_SWEEPS) -> list[ABVerdict]:
    """One verdict per mode timed at this point, and one per launch count both sides took; a broken side instead
    gives one verdict per broken side. Sweep j of `head` pairs with sweep j of `ref` (taken in the same pass)."""
    broken = _broken(block, key, path, head, ref)
    if broken:
        return broken
    out = [_judge_mode(block, key, path, mode, head, ref, floors, min_sweeps) for mode in MODES]
    return [v for v in out if v is not None] + _judge_launches(block, key, path, head, ref)
