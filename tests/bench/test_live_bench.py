"""`qwen36 bench` against the real server: the embedded tiny vLLM CPU server, or --server-url."""
from __future__ import annotations

import asyncio
import json

import pytest

from harness.bench.run import BenchConfig, Workload, run_bench
from harness.bench.client import ClientConfig, make_http_client, stream_request

# Only the agreement test is `timing` (it runs alone, after the parallel suite): the other two assert what was
# streamed and written, which the parallel run's load cannot change.
pytestmark = [pytest.mark.server]


def test_real_server_streams_output_and_reports_usage_with_cached_tokens(openai_server):
    cfg = ClientConfig(openai_server.base_url, openai_server.model, openai_server.api_key, timeout_s=120)
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16, "min_tokens": 16,
            "ignore_eos": True}

    async def go():
        async with make_http_client(cfg) as http:
            return await stream_request(http, cfg, body, "live-0")

    rec = asyncio.run(go())
    assert rec.ok, rec.error
    assert rec.completion_tokens == 16 and rec.prompt_tokens > 0
    assert rec.cached_tokens is not None  # --enable-prompt-tokens-details is on
    assert rec.ttft_s > 0 and rec.e2e_s >= rec.ttft_s


@pytest.mark.slow
def test_bench_on_real_server_measures_decode_and_official_like(openai_server, tmp_path):
    tokenizer = openai_server.model_dir and f"{openai_server.model_dir}/tokenizer.json"
    cfg = BenchConfig(
        workloads=(Workload("decode-micro", (1, 2), requests=4, output_tokens=32),
                   Workload("official-like", (2,), requests=4, output_tokens=16)),
        base_url=openai_server.base_url, model=openai_server.model, api_key=openai_server.api_key,
        out_root=tmp_path, show_progress=False,
        tokenizer=tokenizer, timeout_s=300, client_cpus=openai_server.client_cpus)
    run_dir = run_bench(cfg)
    summary = json.loads((run_dir / "summary.json").read_text())
    for name in ("decode-micro@c1", "decode-micro@c2", "official-like@c2"):
        table = summary["points"][name]["table"]
        assert table["success_rate"] == 1.0, (name, table["failures"])
        assert table["ttft_p90"] > 0 and table["agg_output_tps"] > 0
    official = summary["points"]["official-like@c2"]["table"]
    assert official["cache_hit_rate"] is not None  # reported by the server, whatever its value
    assert official["weighted_throughput"] is not None
    if summary["server_view"] is not None:  # vLLM: Prometheus deltas over the measured phase
        assert summary["server_view"]["official-like@c2"]["deltas"]["prefix_cache_queries"] > 0
    assert (run_dir / "plot.png").exists() and "official-like@c2" in (run_dir / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.timing
def test_ttft_and_tpot_agree_with_vllm_benchmark_client(openai_server, record_property):
    """Each prompt goes through both clients in turn, one request at a time (tests/bench/vllm_agreement.py says why).

    Same definitions (our raw role-chunk / finish-chunk timestamps against vLLM's client): median pair
    difference within 10 ms for TTFT and 1 ms for TPOT; this measures the clients themselves.
    Our definitions: TTFT is never earlier than vLLM's, because vLLM starts at the role-only chunk and we wait
    for the first output; the gap is a few decode steps when the server streams token by token, and up to
    the whole answer when it holds the stream back and flushes it at once (seen on this 2-core machine under
    load), which is exactly why our definition differs. That is checked inside each of our own streams (the
    first output never before the role chunk), not across the pair: the pair's difference also holds the
    clients' own difference, which the same-definition check allows up to 10 ms (fresh-clone CI run,
    2026-12-01: ours minus vLLM's -5.16 ms with our definition and -5.58 ms with vLLM's, so our definition
    was 0.4 ms later, and a 5 ms bound across the pair failed). TPOT ends at the last output event instead of
    the finish chunk: within 1 ms. A client that timed [DONE] as the first event or divided by output events
    instead of tokens fails the same-definition checks."""
    pytest.importorskip("vllm.benchmarks.lib.endpoint_request_func")
    from harness.serving.placement import client_on
    from tests.bench.vllm_agreement import compare_with_vllm_bench

    with client_on(openai_server.client_cpus):  # the core the server's layout leaves to clients
        a = compare_with_vllm_bench(openai_server.base_url, openai_server.model, requests=16, output_tokens=64,
                                    api_key=openai_server.api_key)
    record_property("agreement", json.dumps(a.as_dict()))
    print(json.dumps(a.as_dict(), indent=2))
    # Pairs the server flushed at once time the server, not the clients: left out, but enough must remain.
    assert a.requests >= 8, f"only {a.requests} of {a.pairs_sent} pairs streamed; the server held back the rest"
    # 15 ms, or three standard errors of the paired median where the server's request-to-request noise is
    # larger. Measured with these clients and 16 pairs (2026-12-01): on a fresh server alone +1.0 ms and
    # +0.96 ms (standard error 2.6 ms); in two fresh-clone CI runs, on the session's server after the
    # parallel run with three idle servers beside it, -5.6 ms and +10.6 ms. So under CI's conditions the
    # median moves by about +-11 ms from run to run, more than its own standard error says; why is not
    # pinned down. A client error this check is for (TTFT timed at [DONE], or from the wrong event) is a
    # decode of 64 tokens or more, 600 ms here: far outside the bound.
    ttft_bound = max(0.015, 3 * a.paired_vdef_ttft_diff_se_s)
    assert abs(a.paired_vdef_ttft_diff_median_s) <= ttft_bound, (a.paired_vdef_ttft_diff_median_s, ttft_bound)
    assert abs(a.paired_vdef_tpot_diff_median_s) <= 0.001
    assert a.ours_ttft_def_gap_min_s >= 0, "a stream's first output was timed before its role chunk"
    assert abs(a.paired_tpot_diff_median_s) <= 0.001
