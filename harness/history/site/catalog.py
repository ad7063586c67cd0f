"""What the page knows of each metric, read from the records: unit, direction, regression threshold, whether gated.

A metric's latest record wins (a gate's tolerance may be re-sized; the page judges with today's). Records that
disagree on unit or direction are an error: a line must not change its meaning halfway.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from harness.errors import HarnessError
from harness.history.record import Record

DEFAULT_THRESHOLD = 0.05  # asv's own default, for a gated figure whose record names no tolerance


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    direction: str  # "lower" or "higher" is better
    threshold: float  # relative worsening that counts as a regression, in the metric's own direction
    gated: bool
    kinds: tuple[str, ...]  # the harness runs that measured it

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "higher"


def metric_catalog(records: Iterable[Record]) -> dict[str, Metric]:
    latest: dict[str, tuple[str, Metric]] = {}
    kinds: dict[str, set[str]] = {}
    for record in records:
        for f in record.figures:
            kinds.setdefault(f.metric, set()).add(record.kind)
            metric = Metric(f.metric, f.unit, f.direction, f.threshold or DEFAULT_THRESHOLD, f.gated, ())
            seen = latest.get(f.metric)
            if seen is not None and (seen[1].unit, seen[1].direction) != (metric.unit, metric.direction):
                raise HarnessError(
                    f"metric {f.metric}: {record.source} says {metric.unit!r}/{metric.direction}, an earlier record "
                    f"said {seen[1].unit!r}/{seen[1].direction}; give the changed figure a new metric name")
            if seen is None or record.date >= seen[0]:
                latest[f.metric] = (record.date, metric)
    return {name: Metric(m.name, m.unit, m.direction, m.threshold, m.gated, tuple(sorted(kinds[name])))
            for name, (_, m) in sorted(latest.items())}
