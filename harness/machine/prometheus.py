"""The server-side view: scrape vLLM's Prometheus `/metrics` before and after a run and take deltas."""
from __future__ import annotations

import re

import httpx

# Counters whose run deltas matter (summed over label sets: engines, models).
COUNTERS = {
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
    "queue_time_sum_s": "vllm:request_queue_time_seconds_sum",
    "queue_time_count": "vllm:request_queue_time_seconds_count",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
DISAGREEMENT = 0.05  # absolute difference in hit rate that gets flagged


def parse(text: str) -> dict[str, float]:
    """Metric name -> value summed over label sets (comments and unparsable lines are skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        try:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
        except ValueError:
            continue
    return out


def scrape(base_url: str, timeout_s: float = 10.0) -> dict[str, float] | None:
    """None when the server has no /metrics (not every OpenAI server is vLLM)."""
    try:
        r = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    return parse(r.text) if r.status_code == 200 else None


def deltas(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    if before is None or after is None:
        return None
    d = {k: after.get(name, 0.0) - before.get(name, 0.0) for k, name in COUNTERS.items()
         if name in after}
    q, h = d.get("prefix_cache_queries"), d.get("prefix_cache_hits")
    d["server_prefix_cache_hit_rate"] = (h / q) if q else None
    n = d.get("queue_time_count")
    d["mean_queue_time_s"] = (d["queue_time_sum_s"] / n) if n else None
    return d


def compare_hit_rates(server_rate: float | None, usage_rate: float | None) -> str | None:
    """A sentence when the server's own prefix-cache hit rate and the usage-based one disagree."""
    if server_rate is None or usage_rate is None:
        return None
    if abs(server_rate - usage_rate) > DISAGREEMENT:
        return (f"server prefix-cache hit rate {server_rate:.1%} disagrees with usage cached_tokens "
                f"{usage_rate:.1%} (more than {DISAGREEMENT:.0%} apart): the server counts cache queries "
                "per scheduled block (warm-up and aborted requests included), usage counts per request")
    return None
