"""Cross-check: the same workload measured by vLLM's own benchmark client (`vllm.benchmarks`) and by ours.

Each prompt is sent by both clients in turn, one request at a time, in both orders (ours, theirs, theirs,
ours): each request is prefilled alone, an order effect cancels in the pair's mean, and the difference is
the clients' own.
Why not both at once: the engine starts a step the moment the first request of a round arrives, and the
other, a millisecond later, waits for the next step (a tiny-model prefill step takes about 90 ms on two
cores); the pair's TTFTs then differ by a whole step in the direction of the send order, and the paired
median swung by +-100 ms (CI saw +112 ms; a pacer stream keeping the engine busy made it +145 ms). Sending
one at a time used to be ruled out because a lone stream was often read in one burst; the process
placement of harness/serving/placement.py removed that (no stall in 200 streams at c=1).
The known differences by definition:
- TTFT: vLLM starts at the first chunk with `choices`, which is the role-only chunk; ours at the first
  chunk carrying output. vLLM's is never larger.
- TPOT: vLLM uses (last chunk with `choices` - TTFT) / (output_tokens - 1); the last chunk with choices is
  the finish chunk (empty delta), ours is the last output event; both divide by usage.completion_tokens.
Pairs where either stream was read in one burst (TPOT under `BURST_TPOT_S` on either side) time the
delivery, not the clients: they are counted and left out, and prompts continue until `requests`
comparable pairs are in or `max_requests` pairs were sent.
"""
from __future__ import annotations

import asyncio
import os
import statistics
from dataclasses import asdict, dataclass

from harness.bench.client import ClientConfig, make_http_client, stream_request
from harness.bench.datasets import decode_micro
from harness.bench.metrics import BURST_TPOT_S


@dataclass(frozen=True)
class Agreement:
    """Medians. `ours_*`: our definitions; `ours_vdef_*`: our client's raw timestamps under vLLM's
    definitions (role chunk, finish chunk). Paired = per pair (ours - vLLM's), a pair being the same prompt
    sent by both clients at the same time."""
    requests: int
    output_tokens: int
    pairs_per_round: int  # requests in flight at once per client (1: one at a time)
    ours_ttft_median_s: float
    ours_vdef_ttft_median_s: float
    vllm_ttft_median_s: float
    ours_tpot_median_s: float
    ours_vdef_tpot_median_s: float
    vllm_tpot_median_s: float
    paired_ttft_diff_median_s: float
    paired_tpot_diff_median_s: float
    paired_vdef_ttft_diff_median_s: float  # same definition both sides: measures the clients, not definitions
    paired_vdef_tpot_diff_median_s: float
    # Within each of our requests: first output chunk minus role chunk, the smallest over all requests. The
    # definitions' difference measured in one stream, free of the request-to-request noise of the pairs.
    ours_ttft_def_gap_min_s: float
    # The standard error of paired_vdef_ttft_diff_median_s, from the pairs' own spread (1.2533 * 1.4826 * MAD /
    # sqrt(n), the median's SE under normal noise): how far the request-to-request noise alone moves it.
    paired_vdef_ttft_diff_se_s: float = 0.0
    pairs_sent: int = 0
    pairs_held_back: int = 0  # left out: the server flushed at least one of the two streams at once

    def as_dict(self) -> dict:
        return asdict(self)


async def _measure(base_url: str, model: str, requests: int, output_tokens: int,
                   max_requests: int, api_key: str | None) -> Agreement:
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_chat_completions

    data = decode_micro(seed=1, requests=requests, output_tokens=output_tokens, warmup=0)
    cfg = ClientConfig(base_url, model, api_key, timeout_s=120)
    ours_ttft, ours_tpot, ours_vttft, ours_vtpot, vllm_ttft, vllm_tpot = [], [], [], [], [], []
    def_gaps: list[float] = []

    async def ours(http, i, body):
        rec = await stream_request(http, cfg, body, f"ours-{i}")
        if not rec.ok:
            raise RuntimeError(f"our request {i} failed: {rec.failure} {rec.error}")
        vttft = (rec.t_first_chunk_ns - rec.t0_ns) / 1e9
        vtpot = (rec.t_last_chunk_ns - rec.t_first_chunk_ns) / 1e9 / (rec.completion_tokens - 1)
        return rec.ttft_s, rec.tpot_s, vttft, vtpot

    async def theirs(session, i, body):
        inp = RequestFuncInput(
            prompt=body["messages"][0]["content"], api_url=base_url + "/v1/chat/completions", prompt_len=0,
            output_len=output_tokens, model=model, ignore_eos=True,
            extra_body={"min_tokens": output_tokens, "temperature": 0}, chat_messages=body["messages"])
        out = await async_request_openai_chat_completions(inp, session)
        if not out.success:
            raise RuntimeError(f"vLLM's request {i} failed: {out.error}")
        return out.ttft, (out.latency - out.ttft) / (out.output_tokens - 1)  # as vllm.benchmarks.serve

    sent = held_back = 0
    async with make_http_client(cfg) as http, aiohttp.ClientSession() as session:
        i = 0
        while len(ours_ttft) < requests and sent < max_requests:
            body = data.items[i % len(data.items)].body
            # Both orders per prompt (a crossover): whatever the second request of a pair gains or loses from
            # following the first (an engine still spinning, a warm cache) cancels in the pair's mean.
            t1, p1, vt1, vp1 = await ours(http, i, body)
            vllm_t1, vllm_p1 = await theirs(session, i, body)
            vllm_t2, vllm_p2 = await theirs(session, i, body)
            t2, p2, vt2, vp2 = await ours(http, i, body)
            sent += 1
            i += 1
            if min(p1, p2, vp1, vp2, vllm_p1, vllm_p2) < BURST_TPOT_S:
                held_back += 1
                continue
            def_gaps += [t1 - vt1, t2 - vt2]
            ours_ttft.append((t1 + t2) / 2)
            ours_tpot.append((p1 + p2) / 2)
            ours_vttft.append((vt1 + vt2) / 2)
            ours_vtpot.append((vp1 + vp2) / 2)
            vllm_ttft.append((vllm_t1 + vllm_t2) / 2)
            vllm_tpot.append((vllm_p1 + vllm_p2) / 2)
    if not ours_ttft:
        raise RuntimeError(f"the server held back one stream of every one of {sent} pairs: no pair to compare "
                           "(see harness.bench.metrics.BURST_TPOT_S)")
    med = statistics.median

    def diff(xs, ys):
        return med([a - b for a, b in zip(xs, ys)])

    def median_se(xs, ys):
        d = [a - b for a, b in zip(xs, ys)]
        mad = med([abs(x - med(d)) for x in d])
        return 1.2533 * 1.4826 * mad / len(d) ** 0.5

    return Agreement(
        len(ours_ttft), output_tokens, 1, med(ours_ttft), med(ours_vttft), med(vllm_ttft), med(ours_tpot),
        med(ours_vtpot), med(vllm_tpot), diff(ours_ttft, vllm_ttft), diff(ours_tpot, vllm_tpot),
        diff(ours_vttft, vllm_ttft), diff(ours_vtpot, vllm_tpot), min(def_gaps), median_se(ours_vttft, vllm_ttft),
        sent, held_back)


def compare_with_vllm_bench(base_url: str, model: str, requests: int = 16, output_tokens: int = 64,
                            max_requests: int = 96, api_key: str | None = None) -> Agreement:
    """`requests` comparable pairs (both streams streamed), sending at most `max_requests` pairs; `api_key`: for a
    server started with --api-key (vLLM's client reads it from OPENAI_API_KEY, set for the measurement)."""
    before = os.environ.get("OPENAI_API_KEY")
    if api_key:
        os.environ["OPENAI_API_KEY"] = api_key
    try:
        return asyncio.run(_measure(base_url.rstrip("/"), model, requests, output_tokens, max_requests, api_key))
    finally:
        if before is None:
            os.environ.pop("OPENAI_API_KEY", None)
        else:
            os.environ["OPENAI_API_KEY"] = before
