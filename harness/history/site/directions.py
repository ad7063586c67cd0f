"""Which way is better, on asv's scale: asv knows only "an upward step is a regression".

A lower-is-better figure goes to asv as measured. A higher-is-better one goes as a lower-is-better image of it, and
after `asv publish` every number the page shows for it is turned back into the figure as measured: the graphs (per
machine and the summaries), the list view's last and previous values, the regressions list (and, in __init__, its
feed). A throughput is then drawn in tok/s and a drop is listed as the regression it is (factor < 1).

- A rate (unit `ratio`: success rate, cache hit rate, in [0, 1]) goes as 2 - x: linear, so its steps are the
  rate's own, and finite at 0 (a decode-only workload's cache hit rate is 0). Its tolerance is a change of the
  rate (the gates give rates absolute tolerances); on 2 - x, which lies in [1, 2], a relative threshold of half of
  it marks every drop of at least the tolerance.
- Anything else goes as 1/x, and a relative drop d is the rise d / (1 - d) of 1/x (15% less throughput is 17.6%
  more time per token): the same line, judged the same. A value of 0 has no reciprocal (asv_results leaves it out).
"""
from __future__ import annotations

import json
from pathlib import Path

from harness.history.site.catalog import Metric

RATE = "ratio"


def linear(metric: Metric) -> bool:
    return metric.higher_is_better and metric.unit == RATE


def reciprocal_threshold(drop: float) -> float:
    """A relative drop `drop` of a figure is a rise of drop / (1 - drop) of its reciprocal."""
    return drop / (1.0 - drop) if drop < 1 else 1e9


def asv_threshold(metric: Metric) -> float:
    if not metric.higher_is_better:
        return metric.threshold
    return metric.threshold / 2 if linear(metric) else reciprocal_threshold(metric.threshold)


def drawable(x: float, metric: Metric) -> bool:
    return not metric.higher_is_better or linear(metric) or x > 0


def to_asv(x: float | None, metric: Metric) -> float | None:
    if x is None or not metric.higher_is_better:
        return x
    return 2.0 - x if linear(metric) else 1.0 / x


def from_asv(y, metric: Metric):
    """The inverse of to_asv, through lists (a graph point holds one value per band); None stays None."""
    if isinstance(y, list):
        return [from_asv(v, metric) for v in y]
    if not isinstance(y, (int, float)) or not metric.higher_is_better:
        return y
    return 2.0 - y if linear(metric) else (1.0 / y if y else y)


def _err_from_asv(err, y, metric: Metric):
    """An error around y on asv's scale, as an error around the figure (first order)."""
    if err is None or not metric.higher_is_better or linear(metric) or not y:
        return err
    return err / y ** 2


def restore(html_dir: Path, catalog: dict[str, Metric]) -> int:
    """Rewrite the published files of the higher-is-better metrics; returns how many files changed."""
    higher = {name: m for name, m in catalog.items() if m.higher_is_better}
    changed = 0
    for path in (html_dir / "graphs").rglob("*.json"):
        metric = higher.get(path.stem)
        if metric is not None:  # a graph: [[revision, value or [value per band]], ...]
            points = json.loads(path.read_text())
            path.write_text(json.dumps([[rev, from_asv(v, metric)] for rev, v in points]))
            changed += 1
        elif path.stem == "summary":  # the list view: one row per benchmark (and band)
            rows = json.loads(path.read_text())
            touched = [row for row in rows if row.get("name") in higher]
            for row in touched:
                metric, value = higher[row["name"]], row.get("last_value")
                row["last_err"] = _err_from_asv(row.get("last_err"), value, metric)
                row["last_value"], row["prev_value"] = from_asv(value, metric), from_asv(row.get("prev_value"), metric)
            if touched:
                path.write_text(json.dumps(rows))
                changed += 1
    regressions = html_dir / "regressions.json"
    if regressions.exists():
        data = json.loads(regressions.read_text())
        for entry in data["regressions"]:  # [name(band), graph, params, idx, last, best, jumps]
            metric = higher.get(entry[0].split("(")[0])
            if metric is not None:
                entry[4], entry[5] = from_asv(entry[4], metric), from_asv(entry[5], metric)
                entry[6] = [[a, b, from_asv(v1, metric), from_asv(v2, metric)] for a, b, v1, v2 in entry[6]]
        regressions.write_text(json.dumps(data))
        changed += 1
    return changed
