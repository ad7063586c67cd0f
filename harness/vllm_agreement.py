"""Cross-check: the same workload measured by vLLM's own benchmark client (`vllm.benchmarks`) and by ours.

Each round sends `pairs` prompts through both clients at the same time (concurrency 2 x pairs), so the two
requests of a pair share the prompt and the server's state. Why concurrent rather than at concurrency 1:
on a 2-core CPU server a lone request is often flushed at once at the end (TPOT ~ 0 for both clients, which
would make the TPOT comparison vacuous); a few concurrent streams are delivered token by token.
The known differences by definition:
- TTFT: vLLM starts at the first chunk with `choices`, which is the role-only chunk; ours at the first
  chunk carrying output. vLLM's is never larger.
- TPOT: vLLM uses (last chunk with `choices` - TTFT) / (output_tokens - 1); the last chunk with choices is
  the finish chunk (empty delta), ours is the last output event; both divide by usage.completion_tokens.
Pairs where the server held either stream back and flushed it at once (TPOT under `BURST_TPOT_S` on either
side) time the server's flush, not the clients: they are counted and left out, and rounds continue until
`requests` comparable pairs are in or `max_requests` pairs were sent.

A pacer stream keeps the engine busy for the whole measurement. Without it, an idle engine starts a step
the moment the first request of a round arrives, and the others, a millisecond later, wait for the next
step (a tiny-model prefill step takes about 90 ms on two cores): the pair's TTFTs then differ by one
step, in the direction of whichever client sent first, and the paired median swings by +-100 ms with the
send order (seen in CI: +112 ms). With the engine mid-step, the whole round waits for the same next step.
"""
from __future__ import annotations

import asyncio
import statistics
from dataclasses import asdict, dataclass

from harness.client import ClientConfig, make_http_client, stream_request
from harness.datasets import decode_micro
from harness.metrics import BURST_TPOT_S


@dataclass(frozen=True)
class Agreement:
    """Medians. `ours_*`: our definitions; `ours_vdef_*`: our client's raw timestamps under vLLM's
    definitions (role chunk, finish chunk). Paired = per pair (ours - vLLM's), a pair being the same prompt
    sent by both clients at the same time."""
    requests: int
    output_tokens: int
    pairs_per_round: int
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
    pairs_sent: int = 0
    pairs_held_back: int = 0  # left out: the server flushed at least one of the two streams at once

    def as_dict(self) -> dict:
        return asdict(self)


async def _measure(base_url: str, model: str, requests: int, output_tokens: int, pairs: int,
                   max_requests: int) -> Agreement:
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_chat_completions

    data = decode_micro(seed=1, requests=requests, output_tokens=output_tokens, warmup=0)
    cfg = ClientConfig(base_url, model, timeout_s=120)
    ours_ttft, ours_tpot, ours_vttft, ours_vtpot, vllm_ttft, vllm_tpot = [], [], [], [], [], []

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
        pacer = asyncio.create_task(_pace(http, cfg))
        await asyncio.sleep(0.5)  # until the pacer is decoding
        start = 0
        while len(ours_ttft) < requests and sent < max_requests:
            batch = [(i, data.items[i % len(data.items)]) for i in range(start, start + pairs)]
            mine = [ours(http, i, it.body) for i, it in batch]
            other = [theirs(session, i, it.body) for i, it in batch]
            # Alternate which client sends first: the server schedules in arrival order, and the first
            # request of a round may be prefilled alone, a step ahead of the rest.
            if (start // pairs) % 2:
                res = await asyncio.gather(*other, *mine)
                results = res[len(batch):] + res[:len(batch)]
            else:
                results = await asyncio.gather(*mine, *other)
            sent += len(batch)
            start += pairs
            for (t, p, vt, vp), (vllm_t, vllm_p) in zip(results[:len(batch)], results[len(batch):]):
                if min(p, vp, vllm_p) < BURST_TPOT_S:
                    held_back += 1
                    continue
                ours_ttft.append(t)
                ours_tpot.append(p)
                ours_vttft.append(vt)
                ours_vtpot.append(vp)
                vllm_ttft.append(vllm_t)
                vllm_tpot.append(vllm_p)
        pacer.cancel()
        await asyncio.gather(pacer, return_exceptions=True)
    if not ours_ttft:
        raise RuntimeError(f"the server held back one stream of every one of {sent} pairs: no pair to compare "
                           "(see harness.metrics.BURST_TPOT_S)")
    med = statistics.median

    def diff(xs, ys):
        return med([a - b for a, b in zip(xs, ys)])

    return Agreement(
        len(ours_ttft), output_tokens, pairs, med(ours_ttft), med(ours_vttft), med(vllm_ttft), med(ours_tpot),
        med(ours_vtpot), med(vllm_tpot), diff(ours_ttft, vllm_ttft), diff(ours_tpot, vllm_tpot),
        diff(ours_vttft, vllm_ttft), diff(ours_vtpot, vllm_tpot), sent, held_back)


async def _pace(http, cfg: ClientConfig) -> None:
    """Long greedy decodes, one after another, until cancelled."""
    body = {"messages": [{"role": "user", "content": "pace"}], "max_tokens": 4000, "min_tokens": 4000,
            "ignore_eos": True, "temperature": 0}
    while True:
        await stream_request(http, cfg, body, "pacer")


def compare_with_vllm_bench(base_url: str, model: str, requests: int = 16, output_tokens: int = 64,
                            pairs: int = 2, max_requests: int = 96) -> Agreement:
    """`requests` comparable pairs (both streams streamed), sending at most `max_requests` pairs."""
    return asyncio.run(_measure(base_url.rstrip("/"), model, requests, output_tokens, pairs, max_requests))
