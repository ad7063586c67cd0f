"""The bench metrics, each declared once beside its computation, and a run's summary.

A `Metric` holds its name, unit, direction, description, how a run computes it, and the places it appears:
`table` (the bench's metrics table and report.md), `compare` (the A/B ratios of `qwen36 compare`), `gates`
(the perf gate, tolerance in fixtures/gates/policy.yaml) and `targets` (the platform's bound, in
fixtures/scoring/platform.yaml). The report, compare, gates and scoring take their lists from `shown_in`, in
declaration order (the display order); those files hold numbers only, and naming a metric that is not
declared for them is an error. Nothing else restates a unit or a direction.

The timing points (t0, t_first, t_last, the output events) are harness/bench/client.py's; the conventions behind
them are docs/design.md's. Adding a metric: its declaration in `RUN_METRICS` (a percentile: one entry in a
`Percentiles` family, or a new family) and a test; harness/bench/client.py too if it needs a new per-request field.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Literal

import yaml

from harness.bench.client import FAILURE_CLASSES, RequestRecord
from harness.errors import HarnessError
from harness.bench.loop_lag import client_caused
from harness.paths import SCORING_FILE

Direction = Literal["higher", "lower", "info"]
Place = Literal["table", "compare", "gates", "targets"]
ALL_PLACES: tuple[Place, ...] = ("table", "compare", "gates", "targets")
BURST_TPOT_S = 0.0002
# A stall, as the client sees it: a gap between two output events longer than STALL_MIN_GAP_S and than
# STALL_GAP_FACTOR times the stream's median gap, followed by STALL_BURST_EVENTS events each under
# STALL_BURST_GAP_S apart: the backlog read at once when the reader runs again. (A tool parser that holds
# text back and then sends one bigger delta is a long gap without that burst: not a stall.)
STALL_MIN_GAP_S = 0.1
STALL_GAP_FACTOR = 10
STALL_BURST_EVENTS = 3
STALL_BURST_GAP_S = 0.001


@dataclass(frozen=True)
class Metric:
    """One metric. `compute` is how a run computes it; None for a per-request value, which harness/bench/client.py's
    `RequestRecord` computes. `shown_in`: the places it appears."""
    name: str
    unit: str
    direction: Direction
    description: str
    compute: Callable[[MeasuredRun], float | None] | None = field(default=None, repr=False)
    shown_in: tuple[Place, ...] = ()

    @property
    def scope(self) -> Literal["request", "run"]:
        return "request" if self.compute is None else "run"


def stall_kind(r: RequestRecord) -> str | None:
    """'held_back' (the whole answer in one read), 'gap' (a mid-stream gap then a burst), or None."""
    if (r.completion_tokens or 0) >= 8 and r.tpot_s is not None and r.tpot_s < BURST_TPOT_S:
        return "held_back"
    gaps = r.output_gaps_s
    if len(gaps) < 2:
        return None
    limit = max(STALL_MIN_GAP_S, STALL_GAP_FACTOR * r.median_gap_s)
    for i, g in enumerate(gaps):
        after = gaps[i + 1 : i + 1 + STALL_BURST_EVENTS]
        if g > limit and len(after) == STALL_BURST_EVENTS and max(after) < STALL_BURST_GAP_S:
            return "gap"
    return None


class MeasuredRun:
    """A point's measured requests (warm-up left out), split once for the metrics' computations.

    `exclude_stalled`: leave out of the per-request timing percentiles (`timed`) the stalled requests (`stall_kind`)
    whose stall the client's own event loop was late for (harness.bench.loop_lag: measured, not assumed). Right for a
    client that shares the machine with the server, where the client can be descheduled while the server keeps
    sending (harness/serving/placement.py); a stall the loop was on time for is the server's and stays in every metric.
    Against a remote server nothing is left out: the platform sees every stall. Run-level metrics keep every
    successful request."""

    def __init__(self, records: list[RequestRecord], scoring: Scoring, exclude_stalled: bool):
        self.records = [r for r in records if not r.tags.get("warmup")]
        self.scoring = scoring
        self.exclude_stalled = exclude_stalled
        self.ok = [r for r in self.records if r.ok]
        kinds = [(r, stall_kind(r)) for r in self.ok]
        self.stalled = [r for r, kind in kinds if kind]
        self.held_back = sum(1 for _, kind in kinds if kind == "held_back")
        self.client_stalled = [r for r in self.stalled if client_caused(r)]
        self.timed = [r for r, kind in kinds if not (exclude_stalled and kind and client_caused(r))]
        starts = [r.t0_ns for r in self.records if r.t0_ns is not None]
        ends = [r.t_end_ns for r in self.records if r.t_end_ns is not None]
        self.duration_s = (max(ends) - min(starts)) / 1e9 if starts and ends else None
        self.cached_missing = sum(1 for r in self.ok if r.cached_tokens is None)
        # Token throughputs need a success and a duration; the cache ones every success's cached_tokens too.
        self.has_throughput = bool(self.duration_s and self.ok)
        self.completion_tokens = sum(r.completion_tokens for r in self.ok)
        self.prompt_tokens = sum(r.prompt_tokens or 0 for r in self.ok)
        self.cached_tokens = None if self.cached_missing else sum(r.cached_tokens for r in self.ok)

    def per_second(self, tokens: int | None) -> float | None:
        """tokens / D, where token throughputs are defined."""
        return tokens / self.duration_s if self.has_throughput and tokens is not None else None


@dataclass(frozen=True)
class Percentiles:
    """A per-request timing's percentiles over the run's timed successful requests (`MeasuredRun.timed`),
    linear interpolation; `values` gives a request's values (one, or several pooled over requests)."""
    key: str
    label: str  # as the run's notes name it
    unit: str
    direction: Direction
    definition: str
    values: Callable[[RequestRecord], Iterable[float | None]]
    percentiles: dict[int, tuple[Place, ...]]  # P -> where that percentile appears

    def metrics(self) -> list[Metric]:
        return [Metric(f"{self.key}_p{p}", self.unit, self.direction,
                       f"P{p} of {self.label} over successful requests (linear interpolation): {self.definition}",
                       self._percentile(p), places) for p, places in self.percentiles.items()]

    def _percentile(self, p: int) -> Callable[[MeasuredRun], float | None]:
        return lambda run: percentile((v for r in run.timed for v in self.values(r) if v is not None), p)


TIMING_PERCENTILES = (
    Percentiles("ttft", "TTFT", "s", "lower", "t_first - t0 of each request", lambda r: (r.ttft_s,),
                {50: ("table", "compare"), 90: ("table", "compare", "gates", "targets"), 95: (), 99: ()}),
    Percentiles("tpot", "TPOT", "s", "lower",
                "(t_last - t_first) / (completion_tokens - 1) of each request with two tokens or more",
                lambda r: (r.tpot_s,), {50: ("table",), 90: (), 99: ()}),
    # ITL is per event where TPOT is per token: a request's gaps sum to t_last - t_first (TPOT's numerator),
    # so their mean is its TPOT when every event carries one token; the pooled tail shows the long gaps
    # (a slow step, a stall) that a request's mean TPOT hides.
    Percentiles("itl", "ITL", "s", "lower",
                "inter-token latency, every gap between two successive output events of a request "
                "(RequestRecord.output_gaps_s, microsecond resolution), pooled over requests",
                lambda r: r.output_gaps_s, {99: ("table", "compare")}),
    Percentiles("e2e", "E2E", "s", "lower", "end-to-end latency, t_end - t0 of each request",
                lambda r: (r.e2e_s,), {50: (), 90: (), 99: ()}),
    Percentiles("output_tps", "output TPS", "tok/s", "higher", "per-request output TPS, 1 / TPOT",
                lambda r: (r.output_tps,),
                {10: ("table", "compare", "gates", "targets"), 50: ("table", "compare"), 95: (), 99: ()}),
)


def _uncached_input_tps(run: MeasuredRun) -> float | None:
    return None if run.cached_tokens is None else run.per_second(run.prompt_tokens - run.cached_tokens)


def _cache_hit_rate(run: MeasuredRun) -> float | None:
    if not run.has_throughput or run.cached_tokens is None or not run.prompt_tokens:
        return None
    return run.cached_tokens / run.prompt_tokens


def _weighted_throughput(run: MeasuredRun) -> float | None:
    parts = (run.per_second(run.completion_tokens), _uncached_input_tps(run), run.per_second(run.cached_tokens))
    return None if None in parts else run.scoring.weighted(*parts)


REQUEST_METRICS = [
    Metric("ttft_s", "s", "lower", "t_first - t0: send to the first SSE event carrying generated output"),
    Metric("e2e_s", "s", "lower", "t_end - t0: send to [DONE]"),
    Metric("tpot_s", "s", "lower", "(t_last - t_first) / (completion_tokens - 1), when completion_tokens >= 2"),
    Metric("output_tps", "tok/s", "higher", "1 / tpot_s: the request's decode speed"),
    Metric("prompt_tokens", "tok", "info", "usage.prompt_tokens of the final chunk"),
    Metric("completion_tokens", "tok", "info", "usage.completion_tokens of the final chunk"),
    Metric("cached_tokens", "tok", "info", "usage.prompt_tokens_details.cached_tokens; missing stays missing"),
]
RUN_METRICS = [
    Metric("success_rate", "ratio", "higher", "successful requests / measured requests",
           lambda run: len(run.ok) / len(run.records) if run.records else None, ALL_PLACES),
    *(m for family in TIMING_PERCENTILES for m in family.metrics()),
    Metric("agg_output_tps", "tok/s", "higher", "sum(completion_tokens) / D",
           lambda run: run.per_second(run.completion_tokens), ("table", "compare")),
    Metric("uncached_input_tps", "tok/s", "higher", "sum(prompt_tokens - cached_tokens) / D", _uncached_input_tps,
           ("table",)),
    Metric("cache_tps", "tok/s", "higher", "sum(cached_tokens) / D", lambda run: run.per_second(run.cached_tokens),
           ("table",)),
    Metric("cache_hit_rate", "ratio", "higher", "sum(cached_tokens) / sum(prompt_tokens), token-weighted",
           _cache_hit_rate, ALL_PLACES),
    Metric("weighted_throughput", "score", "higher", "w_out * agg_output_tps + w_in * uncached_input_tps + "
           "w_cache * cache_tps (fixtures/scoring/platform.yaml)", _weighted_throughput, ALL_PLACES),
    Metric("requests", "count", "info", "measured requests (warm-up excluded)", lambda run: len(run.records),
           ("table",)),
    Metric("successes", "count", "info", "requests that met every success condition", lambda run: len(run.ok)),
    Metric("stalled_requests", "count", "info", "successful requests with a stall (harness.bench.metrics.stall_kind)",
           lambda run: len(run.stalled), ("table",)),
    Metric("gap_over_100ms_requests", "count", "info", "successful requests with any gap over 100 ms between "
           "two output events (raw: includes a tool parser holding text back)",
           lambda run: sum(1 for r in run.ok if (r.max_gap_s or 0) > STALL_MIN_GAP_S), ("table",)),
    Metric("duration_s", "s", "info", "D: first send to last t_end over measured requests",
           lambda run: run.duration_s, ("table",)),
]


def _register(metrics: list[Metric]) -> dict[str, Metric]:
    registry: dict[str, Metric] = {}
    for m in metrics:
        if m.name in registry:
            raise ValueError(f"metric {m.name} is declared twice in harness/bench/metrics.py")
        registry[m.name] = m
    return registry


REGISTRY: dict[str, Metric] = _register(REQUEST_METRICS + RUN_METRICS)


def shown_in(place: Place) -> tuple[str, ...]:
    """The metrics declared to appear in `place`, in display order."""
    return tuple(m.name for m in REGISTRY.values() if place in m.shown_in)


def check_declared(names: Iterable[str], place: Place, where: str, complete: bool = True) -> None:
    """`where` (a file's section) may name only metrics declared for `place`; with `complete`, all of them."""
    names = list(names)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise HarnessError(f"{where}: {unknown} are not metrics; known: {sorted(REGISTRY)}")
    declared = shown_in(place)
    undeclared = [n for n in names if n not in declared]
    if undeclared:
        raise HarnessError(f"{where}: {undeclared} are not declared for {place} in harness/bench/metrics.py (declared: "
                           f"{list(declared)}); add {place!r} to the metric's shown_in, or remove the entry")
    missing = [n for n in declared if n not in names]
    if complete and missing:
        raise HarnessError(f"{where}: no entry for {missing}, which harness/bench/metrics.py declares for {place}")


@dataclass(frozen=True)
class Target:
    op: Literal[">=", "<="]
    value: float

    def met(self, x: float) -> bool:
        return x >= self.value if self.op == ">=" else x <= self.value


@dataclass(frozen=True)
class Scoring:
    w_output: float
    w_uncached_input: float
    w_cache: float
    targets: dict[str, Target]

    @classmethod
    def load(cls, path: Path = SCORING_FILE) -> "Scoring":
        try:
            raw = yaml.safe_load(Path(path).read_text())
            w = raw["weights"]
            targets = {name: Target(t["op"], float(t["value"])) for name, t in raw["targets"].items()}
            scoring = cls(float(w["output"]), float(w["uncached_input"]), float(w["cache"]), targets)
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise HarnessError(f"scoring file {path}: {exc!r}; it needs weights.output/uncached_input/cache "
                               "and targets.<metric>: {op, value}") from exc
        check_declared(targets, "targets", f"scoring file {path}, targets")
        return scoring

    def weighted(self, agg_output_tps: float, uncached_input_tps: float, cache_tps: float) -> float:
        return self.w_output * agg_output_tps + self.w_uncached_input * uncached_input_tps + self.w_cache * cache_tps


def percentile(values: Iterable[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    xs = sorted(values)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass(frozen=True)
class RunSummary:
    """One measured repeat of a point: every run metric (None where it cannot be computed), the failures by
    class, the notes that say why a value is missing or what it includes, and the counts behind those notes.

    `to_json()` is its summary.json form; `summary[key]` and `summary.get(key)` read that form, so code that
    reads a fresh summary and code that reads a summary.json read it alike."""
    metrics: dict[str, float | None]  # every metric of RUN_METRICS
    failures: dict[str, int]  # FAILURE_CLASSES -> measured requests that failed so
    notes: list[str]
    bursty_requests: int  # stalled requests read in one burst (TPOT under BURST_TPOT_S)
    stalled_excluded: int  # stalled requests left out of the timing percentiles
    cached_tokens_missing: int  # successful requests whose usage had no cached_tokens
    repeat: int | None = None
    interrupted: bool = False

    def for_repeat(self, repeat: int, interrupted: bool = False) -> "RunSummary":
        return replace(self, repeat=repeat, interrupted=interrupted)

    def to_json(self) -> dict:
        out = {**self.metrics, "failures": dict(self.failures), "notes": list(self.notes),
               "bursty_requests": self.bursty_requests, "stalled_excluded": self.stalled_excluded,
               "cached_tokens_missing": self.cached_tokens_missing}
        if self.repeat is not None:
            out["repeat"] = self.repeat
        if self.interrupted:
            out["interrupted"] = True
        return out

    def __getitem__(self, key: str):
        return self.to_json()[key]

    def get(self, key: str, default=None):
        return self.to_json().get(key, default)


def summarize(records: list[RequestRecord], scoring: Scoring, exclude_stalled: bool = False) -> RunSummary:
    """Per-run metrics over measured (non-warm-up) records (`exclude_stalled`: see `MeasuredRun`). Values
    that cannot be computed are None, with the reason in the notes (no successes, cached_tokens not
    reported...)."""
    run = MeasuredRun(records, scoring, exclude_stalled)
    return RunSummary(
        metrics={m.name: m.compute(run) for m in RUN_METRICS},
        failures={c: sum(1 for r in run.records if r.failure == c) for c in FAILURE_CLASSES},
        notes=_notes(run),
        bursty_requests=run.held_back,
        stalled_excluded=len(run.client_stalled) if exclude_stalled else 0,
        cached_tokens_missing=run.cached_missing,
    )


def _notes(run: MeasuredRun) -> list[str]:
    notes = []
    # A stream with TPOT under 0.2 ms (over 5000 tok/s for one sequence) was read in one go, not decoded
    # that fast; a mid-stream gap followed by a burst is the same thing halfway. Counted, and left out of
    # the timing percentiles only where `exclude_stalled` says the stall is the client's.
    if run.stalled:
        what = (f"{run.held_back} read in one burst (TPOT under 0.2 ms), {len(run.stalled) - run.held_back} with "
                "a mid-stream gap followed by a burst")
        labels = " / ".join(f.label for f in TIMING_PERCENTILES)
        client = len(run.client_stalled)
        fate = (f"{client} of them the client's (its event loop was late for most of the stall, harness.bench.loop_lag): "
                f"left out of {labels} percentiles; the rest were the server's and stay in every metric"
                if run.exclude_stalled else "kept in every metric: their TPOT / output TPS are not decode speed")
        notes.append(f"{len(run.stalled)} of {len(run.ok)} successful request(s) stalled ({what}); {fate}")
    if run.has_throughput and run.cached_missing:
        notes.append(f"{run.cached_missing} successful request(s) had no cached_tokens: cache metrics and "
                     "weighted_throughput are not computed (start vLLM with --enable-prompt-tokens-details)")
    elif not run.ok:
        notes.append("no successful request")
    return notes


def target_distance(summary: RunSummary | dict, scoring: Scoring) -> list[dict]:
    """One row per platform target: value, target, met, and the distance in the metric's direction
    (positive = margin, negative = shortfall)."""
    rows = []
    for name, t in scoring.targets.items():
        v = summary.get(name)
        row = {"metric": name, "op": t.op, "target": t.value, "value": v, "met": None, "distance": None}
        if v is not None:
            row["met"] = t.met(v)
            row["distance"] = (v - t.value) if t.op == ">=" else (t.value - v)
        rows.append(row)
    return rows
