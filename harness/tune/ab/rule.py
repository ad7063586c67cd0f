"""The A/B rule of `qwen36 tune --ab`, on numbers alone (no device): is this checkout (head) slower than the
reference (ref) at a point, the two timed in the same run.

Each sweep times a point on both sides back to back, so sweep j's ratio head/ref compares two times taken
seconds apart on the same clocks. Head is **slower** when every sweep's ratio is above 1 + tolerance, and
**faster** when every one is below 1 / (1 + tolerance): one noisy sweep cannot fail an A/B, a real slowdown
moves every sweep (the gate's rule, harness/tune/check/rule.py, with the reference measured now instead of
recorded). The tolerance is the gate's floor for the mode (graph replay 10%, eager 15%): both sides share the
machine, so there is no recorded spread to widen it by. A wrong output, an error or a path that cannot run
on either side fails the point whatever the times say.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

from ..check.rule import FLOORS, MIN_SWEEPS, point_name

__all__ = ["SideSweeps", "ABVerdict", "judge_ab", "MODES"]

MODES = ("eager", "graph")
FAILING = ("slower", "too-few-sweeps", "wrong", "error", "missing")


@dataclass(frozen=True)
class SideSweeps:
    """One side's results at one point: its worst status over the sweeps and each sweep's median per mode
    (None where that sweep has no time in that mode, e.g. a graph that was not captured)."""
    status: str  # ok | wrong | error | missing (the point did not run on this side)
    detail: str = ""
    eager_us: Sequence[float | None] = ()
    graph_us: Sequence[float | None] = ()
    graph_note: str = ""

    def sweeps(self, mode: str) -> Sequence[float | None]:
        return self.eager_us if mode == "eager" else self.graph_us


@dataclass(frozen=True)
class ABVerdict:
    block: str
    key: int
    path: str
    mode: str  # eager | graph | "" for a verdict on the point as a whole (a broken side)
    status: str  # pass | slower | faster | too-few-sweeps | wrong | error | missing | unpaired
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


def _judge_mode(block: str, key: int, path: str, mode: str, head: SideSweeps, ref: SideSweeps, tol: float,
                min_sweeps: int) -> ABVerdict | None:
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
             floors: Mapping[str, float] = FLOORS, min_sweeps: int = MIN_SWEEPS) -> list[ABVerdict]:
    """One verdict per mode timed at this point; a broken side instead gives one verdict per broken side.
    Sweep j of `head` pairs with sweep j of `ref` (taken in the same pass)."""
    broken = _broken(block, key, path, head, ref)
    if broken:
        return broken
    out = [_judge_mode(block, key, path, mode, head, ref, floors[mode], min_sweeps) for mode in MODES]
    return [v for v in out if v is not None]
