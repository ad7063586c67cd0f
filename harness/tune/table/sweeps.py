"""Several sweeps of one point, as one row: what a gate needs is how far a point's time moves between passes
over the whole sweep, not only the spread of the samples inside one pass.

Each sweep times every path at every point (median of `--reps` samples); `merge_sweeps` turns the rows of
all sweeps into one row per (block, point, path) whose time is the median of the sweeps' medians and whose
`extra` keeps every sweep's median (`eager_sweeps_us`, `graph_sweeps_us`, `gpu_sweeps_us`: the GPU's own time,
`host_sweeps_us`: host microseconds per call) for the table's timings, and the launches of one call and one replay
from the sweep that counted them (`launches`, `graph_launches`: one sweep of a run counts, the first).
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from ..measure.point import Measurement
from ..measure.timing import Timing

__all__ = ["merge_sweeps", "sweep_medians"]

_STATUS_ORDER = ("wrong", "error", "ok")  # a path wrong or failing in any sweep is that, whatever the others say


def _merged_timing(timings: list[Timing]) -> Timing | None:
    if not timings:
        return None
    return Timing(statistics.median(t.median_us for t in timings), statistics.median(t.p25_us for t in timings),
                  statistics.median(t.p75_us for t in timings), sum(t.samples for t in timings))


def sweep_medians(rows: list[Measurement], mode: str) -> list[float]:
    """Each sweep's median in `mode` ("eager", "graph" or "gpu"), for the rows of one point and path; "host": each
    sweep's host microseconds per call."""
    if mode == "host":
        return [r.host_us for r in rows if r.host_us is not None]
    return [getattr(r, mode).median_us for r in rows if getattr(r, mode) is not None]


def _merge(group: list[Measurement]) -> Measurement:
    first = group[0]
    if len(group) == 1:
        return replace(first, extra={**first.extra, **_sweeps_extra(group)})
    worst = min(group, key=lambda r: _STATUS_ORDER.index(r.status) if r.status in _STATUS_ORDER else 0)
    ok = worst.status == "ok"
    graphs = [r.graph for r in group if r.graph is not None]
    gpus = [r.gpu for r in group if r.gpu is not None]
    # A graph time stands only where every sweep captured and checked its replay.
    graph = _merged_timing(graphs) if ok and len(graphs) == len(group) else None
    errors_eager = [r.err_eager for r in group if r.err_eager is not None]
    errors_graph = [r.err_graph for r in group if r.err_graph is not None]
    return replace(
        first, status=worst.status, detail=worst.detail,
        eager=_merged_timing([r.eager for r in group if r.eager is not None]) if ok else None,
        graph=graph, graph_note=next((r.graph_note for r in group if r.graph is None and r.graph_note), ""),
        gpu=_merged_timing(gpus) if ok and len(gpus) == len(group) else None,
        host_us=statistics.median(h) if ok and (h := sweep_medians(group, "host")) else None,
        launches=_counted(group, "launches"), graph_launches=_counted(group, "graph_launches"),
        err_eager=max(errors_eager) if errors_eager else None, err_graph=max(errors_graph) if errors_graph else None,
        extra={**first.extra, **_sweeps_extra(group)},
    )


def _counted(group: list[Measurement], field: str) -> dict[str, int] | None:
    """`field` ("launches" or "graph_launches") of the sweep that counted, if one did."""
    return next((getattr(r, field) for r in group if getattr(r, field) is not None), None)


def _sweeps_extra(group: list[Measurement]) -> dict:
    return {"sweeps": len(group), **{f"{mode}_sweeps_us": [round(v, 3) for v in sweep_medians(group, mode)]
                                     for mode in ("eager", "graph", "gpu", "host")}}


def merge_sweeps(rows: list[Measurement]) -> list[Measurement]:
    """One row per (block, key, path), in the order first measured."""
    groups: dict[tuple, list[Measurement]] = {}
    for r in rows:
        groups.setdefault((r.block, r.key, r.path), []).append(r)
    return [_merge(g) for g in groups.values()]
