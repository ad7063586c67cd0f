"""Run workloads against a server: fixed concurrency, warm-up excluded, repeats, a concurrency sweep with a
named stop reason, a progress bar on stderr, and Ctrl-C that keeps what was measured."""
from __future__ import annotations

import asyncio
import signal
import sys
from dataclasses import dataclass, field
from typing import Callable

from tqdm import tqdm

from harness.bench.client import ClientConfig, RequestRecord, make_http_client, stream_request
from harness.bench.datasets import Dataset, Item
from harness.bench.loop_lag import LoopLag, attribute, watching
from harness.bench.metrics import RunSummary, Scoring, summarize


@dataclass(frozen=True)
class Point:
    """One measured condition: a dataset at a concurrency, repeated."""
    name: str
    dataset: Dataset
    concurrency: int
    repeats: int = 1


@dataclass
class PointResult:
    point: Point
    records: list[RequestRecord] = field(default_factory=list)
    summaries: list[RunSummary] = field(default_factory=list)  # one per completed repeat
    interrupted: bool = False


async def _run_items(http, cfg: ClientConfig, items: list[Item], concurrency: int, tags: dict,
                     bar: tqdm | None, stop: asyncio.Event, id_prefix: str) -> list[RequestRecord]:
    """Keep `concurrency` requests in flight until `items` are done or `stop` is set."""
    queue = list(enumerate(items))
    queue.reverse()
    records: list[RequestRecord] = []

    async def worker() -> None:
        while queue and not stop.is_set():
            i, item = queue.pop()
            rec = await stream_request(http, cfg, item.body, f"{id_prefix}-{i}", {**tags, **item.tags})
            records.append(rec)
            if bar is not None:
                bar.update(1)
                failed = sum(1 for r in records if not r.ok)
                if failed:
                    bar.set_postfix(failed=failed)

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([asyncio.gather(*tasks), waiter], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        for t in tasks:
            t.cancel()  # in-flight requests are dropped, not recorded as failures
        await asyncio.gather(*tasks, return_exceptions=True)
    waiter.cancel()
    return records


def _warmup_items(ds: Dataset, concurrency: int) -> list[Item]:
    """At least one warm-up request per connection the measured phase will use (cycling the dataset's)."""
    if not ds.warmup:
        return []
    n = max(len(ds.warmup), concurrency)
    return [ds.warmup[i % len(ds.warmup)] for i in range(n)]


async def _run_point(cfg: ClientConfig, point: Point, scoring: Scoring, stop: asyncio.Event,
                     on_repeat: Callable[[], None] | None, show_progress: bool,
                     exclude_stalled: bool) -> PointResult:
    result = PointResult(point)
    async with watching() as lag:  # the client's own lateness, which tells a client's stall from a server's
        return await _measure_point(cfg, point, scoring, stop, on_repeat, show_progress, exclude_stalled, result,
                                    lag)


async def _measure_point(cfg: ClientConfig, point: Point, scoring: Scoring, stop: asyncio.Event,
                         on_repeat: Callable[[], None] | None, show_progress: bool, exclude_stalled: bool,
                         result: PointResult, lag: LoopLag) -> PointResult:
    ds = point.dataset
    # One client per point: the warm-up opens the connections the measured phase then reuses.
    async with make_http_client(cfg, max_connections=max(point.concurrency, 1)) as http:
        for rep in range(point.repeats):
            base = {"point": point.name, "dataset": ds.name, "concurrency": point.concurrency, "repeat": rep}
            warm = _warmup_items(ds, point.concurrency)
            if warm:
                result.records += await _run_items(http, cfg, warm, point.concurrency, {**base, "warmup": True},
                                                   None, stop, f"{point.name}-r{rep}-w")
            if on_repeat:
                on_repeat()  # e.g. the Prometheus scrape before the measured phase
            bar = tqdm(total=len(ds.items), desc=f"{point.name} r{rep}", file=sys.stderr, leave=True,
                       disable=not show_progress, unit="req")
            measured = await _run_items(http, cfg, ds.items, point.concurrency, {**base, "warmup": False}, bar,
                                        stop, f"{point.name}-r{rep}")
            bar.close()
            attribute(measured, lag)
            result.records += measured
            if stop.is_set():
                result.interrupted = True
                if measured:
                    result.summaries.append(summarize(measured, scoring, exclude_stalled).for_repeat(rep, True))
                break
            result.summaries.append(summarize(measured, scoring, exclude_stalled).for_repeat(rep))
    return result


@dataclass(frozen=True)
class SweepPolicy:
    max_error_rate: float = 0.01
    ttft_slo_s: float | None = None
    saturation_gain: float = 0.05  # stop when throughput grows by less than this fraction


def sweep_stop_reason(prev: dict | None, cur: dict, policy: SweepPolicy, server_alive: bool) -> str | None:
    """Why a concurrency sweep stops after `cur`, or None to go on."""
    if not server_alive:
        return "server_crash"
    if cur["success_rate"] is None or cur["success_rate"] < 1 - policy.max_error_rate:
        return "error_rate"
    if policy.ttft_slo_s is not None and (cur["ttft_p90"] or 0) > policy.ttft_slo_s:
        return "ttft_slo_exceeded"
    if prev is not None and prev.get("agg_output_tps") and cur.get("agg_output_tps") is not None:
        if cur["agg_output_tps"] < prev["agg_output_tps"]:
            return "throughput_regressing"
        if cur["agg_output_tps"] < prev["agg_output_tps"] * (1 + policy.saturation_gain):
            return "throughput_saturated"
    return None


def run_points(cfg: ClientConfig, points: list[Point], scoring: Scoring, *, show_progress: bool = True,
               before_measure: Callable[[Point], None] | None = None,
               after_point: Callable[[PointResult], str | None] | None = None,
               exclude_stalled: bool = False) -> tuple[list[PointResult], str]:
    """Run points in order (`exclude_stalled`: see harness.bench.metrics.summarize). `after_point` may return a stop reason (the sweep). Returns the results and
    why the run ended: "completed", "interrupted" (Ctrl-C) or a sweep stop reason."""

    async def main() -> tuple[list[PointResult], str]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread (e.g. inside a test runner thread)
            pass
        results: list[PointResult] = []
        try:
            for point in points:
                cb = (lambda p=point: before_measure(p)) if before_measure else None
                res = await _run_point(cfg, point, scoring, stop, cb, show_progress, exclude_stalled)
                results.append(res)
                if res.interrupted:
                    return results, "interrupted"
                reason = after_point(res) if after_point else None
                if reason:
                    return results, reason
            return results, "completed"
        finally:
            try:
                loop.remove_signal_handler(signal.SIGINT)
            except (NotImplementedError, RuntimeError):
                pass

    return asyncio.run(main())
