"""How precisely two ways of comparing a timing percentile between two arms resolve it, on measured interleaved runs.

The paired gate (harness.gates.paired) takes each block's percentile and tests the mean of the per-pair log ratios.
The alternative weighed for issue 44: each arm's percentile over all its requests of the run (every request used),
its uncertainty by resampling whole pairs (so the pairing's common drift stays in each resample). Both estimate
the same change; the one with the smaller standard error resolves more. Printed per run and check, as Markdown:

    PYTHONPATH=. .venv/bin/python tools/percentile_estimators.py RUN_DIR [RUN_DIR ...] [--a A --b B]

RUN_DIR: an interleaved run (`qwen36 ab` writes them: runs/<time>-ab, with arms A and B).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from harness.bench.metrics import percentile

CHECKS = (("decode-micro@c2", "output_tps", 10, "higher"), ("official-like@c1", "ttft_s", 90, "lower"))
RESAMPLES = 2000


def blocks(run: Path, arm: str, point: str, field: str) -> dict[int, list[float]]:
    """Per round, the arm's measured requests' values at `point` (warm-ups and failures left out)."""
    out: dict[int, list[float]] = defaultdict(list)
    for line in (run / arm / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        tags = r.get("tags") or {}
        if tags.get("point") == point and not tags.get("warmup") and r.get("ok") and r.get(field) is not None:
            out[tags["round"]].append(r[field])
    return out


def compare(run: Path, a: str, b: str, point: str, field: str, p: int, direction: str) -> dict:
    xa, xb = blocks(run, a, point, field), blocks(run, b, point, field)
    rounds = sorted(set(xa) & set(xb))
    sign = -1.0 if direction == "higher" else 1.0  # positive = b worse

    def worse(va: list[float], vb: list[float]) -> float:
        return sign * (math.log(percentile(vb, p)) - math.log(percentile(va, p)))

    pairs = [worse(xa[r], xb[r]) for r in rounds]

    def pooled(picked) -> float:
        return worse([v for r in picked for v in xa[r]], [v for r in picked for v in xb[r]])

    rng = np.random.default_rng(0)
    boot = [pooled([rounds[i] for i in rng.integers(0, len(rounds), len(rounds))]) for _ in range(RESAMPLES)]
    return {"pairs": len(rounds), "gate_mean": statistics.fmean(pairs),
            "gate_se": statistics.stdev(pairs) / math.sqrt(len(pairs)), "pooled": pooled(rounds),
            "pooled_se": float(np.std(boot, ddof=1))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--a", default="A")
    ap.add_argument("--b", default="B")
    args = ap.parse_args(argv)
    print("| run | check | pairs | gate: mean of pair log ratios | its SE | pooled percentile, log ratio | its SE "
          "(pairs resampled) | SE pooled / SE gate |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for run in args.runs:
        for point, field, p, direction in CHECKS:
            c = compare(run, args.a, args.b, point, field, p, direction)
            ratios.append(c["pooled_se"] / c["gate_se"])
            print(f"| {run.name} | {point} P{p} {field} | {c['pairs']} | {c['gate_mean']:+.4f} | {c['gate_se']:.4f} | "
                  f"{c['pooled']:+.4f} | {c['pooled_se']:.4f} | {ratios[-1]:.2f} |")
    print(f"\nSE pooled / SE gate over {len(ratios)} checks: median {statistics.median(ratios):.2f}, "
          f"range {min(ratios):.2f}-{max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
