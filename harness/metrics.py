"""The metric registry (declared once: name, unit, direction, description) and the per-run summary.

Definitions are shared/DESIGN.md's. Reports, baselines and gates read `REGISTRY`; nothing else should
restate a unit or a direction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

import yaml

from harness.client import FAILURE_CLASSES, RequestRecord
from harness.errors import HarnessError
from harness.paths import SCORING_FILE

Direction = Literal["higher", "lower", "info"]
BURST_TPOT_S = 0.0002
# A stall, as the client sees it: a gap between two output events longer than STALL_MIN_GAP_S and than
# STALL_GAP_FACTOR times the stream's median gap, followed by STALL_BURST_EVENTS events each under
# STALL_BURST_GAP_S apart: the backlog read at once when the reader runs again. (A tool parser that holds
# text back and then sends one bigger delta is a long gap without that burst: not a stall.)
STALL_MIN_GAP_S = 0.1
STALL_GAP_FACTOR = 10
STALL_BURST_EVENTS = 3
STALL_BURST_GAP_S = 0.001
# The per-request timings a stall corrupts; run-level metrics (throughput over D, cache, success) keep it.
STALL_CORRUPTED = ("ttft", "tpot", "e2e", "output_tps")


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    direction: Direction
    description: str
    scope: Literal["request", "run"] = "run"


def _m(*args, **kw) -> Metric:
    return Metric(*args, **kw)


_REQUEST_METRICS = [
    _m("ttft_s", "s", "lower", "t_first - t0: send to the first SSE event carrying generated output", "request"),
    _m("e2e_s", "s", "lower", "t_end - t0: send to [DONE]", "request"),
    _m("tpot_s", "s", "lower", "(t_last - t_first) / (completion_tokens - 1), when completion_tokens >= 2", "request"),
    _m("output_tps", "tok/s", "higher", "1 / tpot_s: the request's decode speed", "request"),
    _m("prompt_tokens", "tok", "info", "usage.prompt_tokens of the final chunk", "request"),
    _m("completion_tokens", "tok", "info", "usage.completion_tokens of the final chunk", "request"),
    _m("cached_tokens", "tok", "info", "usage.prompt_tokens_details.cached_tokens; missing stays missing", "request"),
]
_PCT = {"ttft": ("s", "lower", "TTFT"), "tpot": ("s", "lower", "TPOT"), "e2e": ("s", "lower", "end-to-end latency"),
        "output_tps": ("tok/s", "higher", "per-request output TPS")}
PERCENTILES = {"ttft": (50, 90, 95, 99), "tpot": (50, 90, 99), "e2e": (50, 90, 99), "output_tps": (10, 50, 95, 99)}
_RUN_METRICS = [
    _m(f"{k}_p{p}", _PCT[k][0], _PCT[k][1],
       f"P{p} of {_PCT[k][2]} over successful requests (linear interpolation)")
    for k, ps in PERCENTILES.items() for p in ps
] + [
    _m("agg_output_tps", "tok/s", "higher", "sum(completion_tokens) / D"),
    _m("uncached_input_tps", "tok/s", "higher", "sum(prompt_tokens - cached_tokens) / D"),
    _m("cache_tps", "tok/s", "higher", "sum(cached_tokens) / D"),
    _m("cache_hit_rate", "ratio", "higher", "sum(cached_tokens) / sum(prompt_tokens), token-weighted"),
    _m("success_rate", "ratio", "higher", "successful requests / measured requests"),
    _m("weighted_throughput", "score", "higher",
       "w_out * agg_output_tps + w_in * uncached_input_tps + w_cache * cache_tps (fixtures/scoring/platform.yaml)"),
    _m("duration_s", "s", "info", "D: first send to last t_end over measured requests"),
    _m("requests", "count", "info", "measured requests (warm-up excluded)"),
    _m("successes", "count", "info", "requests that met every success condition"),
    _m("stalled_requests", "count", "info", "successful requests with a stall (harness.metrics.stall_kind)"),
    _m("gap_over_100ms_requests", "count", "info", "successful requests with any gap over 100 ms between "
       "two output events (raw: includes a tool parser holding text back)"),
]
REGISTRY: dict[str, Metric] = {m.name: m for m in _REQUEST_METRICS + _RUN_METRICS}


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
        unknown = sorted(set(targets) - set(REGISTRY))
        if unknown:
            raise HarnessError(f"scoring file {path}: targets {unknown} are not metrics; known: {sorted(REGISTRY)}")
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


def stall_kind(r: RequestRecord) -> str | None:
    """'held_back' (the whole answer in one read), 'gap' (a mid-stream gap then a burst), or None."""
    if (r.completion_tokens or 0) >= 8 and r.tpot_s is not None and r.tpot_s < BURST_TPOT_S:
        return "held_back"
    o = r.output_offsets_us
    gaps = [(b - a) / 1e6 for a, b in zip(o, o[1:])]
    if len(gaps) < 2:
        return None
    limit = max(STALL_MIN_GAP_S, STALL_GAP_FACTOR * sorted(gaps)[len(gaps) // 2])
    for i, g in enumerate(gaps):
        after = gaps[i + 1 : i + 1 + STALL_BURST_EVENTS]
        if g > limit and len(after) == STALL_BURST_EVENTS and max(after) < STALL_BURST_GAP_S:
            return "gap"
    return None


def summarize(records: list[RequestRecord], scoring: Scoring, exclude_stalled: bool = False) -> dict:
    """Per-run metrics over measured (non-warm-up) records. Values that cannot be computed are None, with
    the reason under `notes` (no successes, cached_tokens not reported...).

    `exclude_stalled`: leave stalled requests (`stall_kind`) out of the per-request timing percentiles.
    Right for a client that shares the machine with the server, where a stall is the client descheduled
    while the server kept sending (harness/placement.py); wrong for a remote server, where a stall is
    the server's and the platform sees it too."""
    records = [r for r in records if not r.tags.get("warmup")]
    ok = [r for r in records if r.ok]
    notes: list[str] = []
    stalled = [r for r in ok if stall_kind(r)]
    timed = [r for r in ok if not (exclude_stalled and stall_kind(r))]
    out: dict = {name: None for name, m in REGISTRY.items() if m.scope == "run"}
    out["requests"] = len(records)
    out["successes"] = len(ok)
    out["failures"] = {c: sum(1 for r in records if r.failure == c) for c in FAILURE_CLASSES}
    out["success_rate"] = len(ok) / len(records) if records else None
    per_request = {
        "ttft": [r.ttft_s for r in timed],
        "tpot": [r.tpot_s for r in timed if r.tpot_s is not None],
        "e2e": [r.e2e_s for r in timed],
        "output_tps": [r.output_tps for r in timed if r.output_tps is not None],
    }
    for k, ps in PERCENTILES.items():
        for p in ps:
            out[f"{k}_p{p}"] = percentile(per_request[k], p)
    starts = [r.t0_ns for r in records if r.t0_ns is not None]
    ends = [r.t_end_ns for r in records if r.t_end_ns is not None]
    duration = (max(ends) - min(starts)) / 1e9 if starts and ends else None
    out["duration_s"] = duration
    # A stream with TPOT under 0.2 ms (over 5000 tok/s for one sequence) was read in one go, not decoded
    # that fast; a mid-stream gap followed by a burst is the same thing halfway. Counted, and left out of
    # the timing percentiles only where `exclude_stalled` says the stall is the client's.
    out["bursty_requests"] = sum(1 for r in stalled if stall_kind(r) == "held_back")
    out["stalled_requests"] = len(stalled)
    out["stalled_excluded"] = len(stalled) if exclude_stalled else 0
    out["gap_over_100ms_requests"] = sum(1 for r in ok if (r.max_gap_s or 0) > STALL_MIN_GAP_S)
    if stalled:
        held = out["bursty_requests"]
        what = (f"{held} read in one burst (TPOT under 0.2 ms), {len(stalled) - held} with a mid-stream gap "
                "followed by a burst")
        fate = ("left out of TTFT / TPOT / E2E / output TPS percentiles (client and server share this machine: "
                "the client was descheduled, see harness/placement.py)" if exclude_stalled else
                "kept in every metric: their TPOT / output TPS are not decode speed")
        notes.append(f"{len(stalled)} of {len(ok)} successful request(s) stalled ({what}); {fate}")
    missing_cached = sum(1 for r in ok if r.cached_tokens is None)
    out["cached_tokens_missing"] = missing_cached
    if duration and ok:
        completion = sum(r.completion_tokens for r in ok)
        prompt = sum(r.prompt_tokens or 0 for r in ok)
        out["agg_output_tps"] = completion / duration
        if missing_cached:
            notes.append(f"{missing_cached} successful request(s) had no cached_tokens: cache metrics and "
                         "weighted_throughput are not computed (start vLLM with --enable-prompt-tokens-details)")
        else:
            cached = sum(r.cached_tokens for r in ok)
            out["uncached_input_tps"] = (prompt - cached) / duration
            out["cache_tps"] = cached / duration
            out["cache_hit_rate"] = cached / prompt if prompt else None
            out["weighted_throughput"] = scoring.weighted(out["agg_output_tps"], out["uncached_input_tps"],
                                                          out["cache_tps"])
    elif not ok:
        notes.append("no successful request")
    out["notes"] = notes
    return out


def target_distance(summary: dict, scoring: Scoring) -> list[dict]:
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
