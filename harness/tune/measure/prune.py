"""Dropping paths that can no longer win, so a sweep spends device time only on candidates."""
from __future__ import annotations

from dataclasses import dataclass, field

from .point import Measurement

__all__ = ["Pruner"]


@dataclass
class Pruner:
    """Drops a path from larger points once it failed at a point, or ran `factor` times slower than the best
    path there while costing more than `min_cost_us` a call (eager): such a path can no longer be the choice,
    and each call costs device time. Cheap calls are kept whatever their ratio, because launch-bound paths
    that lose at small T (grouped_mm) can win at large T. Every drop is noted in the report."""

    factor: float
    prefer_graph: bool
    min_cost_us: float = 1000.0
    dropped: dict[str, tuple[int, str]] = field(default_factory=dict)  # path -> (last point it ran at, why)

    def keeps(self, path: str, key: int) -> bool:
        return path not in self.dropped or key <= self.dropped[path][0]

    def update(self, rows: list[Measurement]) -> None:
        ranked = [(r.best(self.prefer_graph), r) for r in rows]
        best = min((b[0] for b, _ in ranked if b), default=None)
        for b, r in ranked:
            if r.path in self.dropped:
                continue
            if r.status == "error":
                self.dropped[r.path] = (r.key, f"{r.path} dropped after {r.block} {r.key}: {r.detail}")
            elif b and best and b[0] > self.factor * best and r.eager.median_us > self.min_cost_us:
                self.dropped[r.path] = (r.key, f"{r.path} dropped after {r.block} {r.key}: "
                                                   f"{b[0] / best:.0f}x the best there")
