"""Measurement truth: the client against a synthetic server that emits events at known times."""
from __future__ import annotations

import asyncio
import time

import pytest

from harness.bench.client import ClientConfig, make_http_client, stream_request
from harness.bench.loop_lag import watching
from harness.bench.metrics import Scoring, summarize
from tests.unit.synthetic_server import Scenario, SyntheticServer, chunk, normal_stream, usage

# Wall-clock assertions: `make test` runs this module alone, after the parallel suite.
pytestmark = pytest.mark.timing

TOL_S = 0.002
LOADED_TOL_S = 0.010  # one reading on a loaded 2-core machine


def _run(server: SyntheticServer, model: str, *, timeout_s: float = 10.0, stall_s: float = 5.0):
    cfg = ClientConfig(server.url, model, timeout_s=timeout_s, stall_timeout_s=stall_s)

    async def go():
        # As the runner does: how late the client's own loop was, here over the whole request.
        async with watching() as lag, make_http_client(cfg) as http:
            rec = await stream_request(http, cfg, {"messages": [{"role": "user", "content": "x"}]}, "r0")
        if rec.t0_ns is not None:
            rec.client_late_s = lag.late_within(rec.t0_ns, time.monotonic_ns()) / 1e9
        return rec

    return asyncio.run(go())


def _transit_s(server: SyntheticServer, rec) -> float:
    """From the client's t0 to the server reading the request: connection set-up and send, part of TTFT."""
    return (server.served[-1].received_ns - rec.t0_ns) / 1e9


def _done_tail(tokens=3, prompt=10, cached=0, finish="stop"):
    return [(0.0, chunk(finish_reason=finish)), (0.0, usage(prompt, tokens, cached)), (0.0, "[DONE]")]


SCENARIOS = {
    "timed": normal_stream(ttft_s=0.150, gap_s=0.020, tokens=11, prompt=123, cached=64),
    "role_then_reasoning": Scenario([(0.0, chunk(role="assistant", content="")), (0.080, chunk(reasoning="hm")),
                                     (0.100, chunk("a"))] + [(0.1, s) for _, s in _done_tail(2)]),
    "tool_call_only": Scenario([(0.0, chunk(role="assistant")), (0.050, chunk(tool_calls=[
        {"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]))]
        + [(0.05, s) for _, s in _done_tail(1, finish="tool_calls")]),
    "inband_error": Scenario([(0.0, chunk("a")), (0.01, {"error": {"message": "engine dead", "type": "Internal",
                                                                     "code": 500}}), (0.01, "[DONE]")]),
    "no_done": Scenario([(0.0, chunk("a")), (0.0, chunk(finish_reason="stop")), (0.0, usage(5, 1)), (0.0, "END")]),
    "no_cached": Scenario([(0.0, chunk("a")), (0.0, chunk("b"))] + _done_tail(2, cached=None)),
    "no_usage": Scenario([(0.0, chunk("a")), (0.0, chunk(finish_reason="stop")), (0.0, "[DONE]")]),
    "empty": Scenario([(0.0, chunk(role="assistant", content=""))] + _done_tail(0)),
    "aborted": Scenario([(0.0, chunk("a"))] + _done_tail(1, finish="abort")),
    "dropped": Scenario([(0.0, chunk("a")), (0.02, chunk("b")), (0.03, "DROP")]),
    "stalled": Scenario([(0.0, chunk("a")), (0.0, "STALL")]),
    "http_400": Scenario(status=400, error_body={"error": {"message": "max_tokens too large", "param": "max_tokens"}}),
    "http_503": Scenario(status=503),
}


@pytest.fixture(scope="module")
def server():
    with SyntheticServer(SCENARIOS) as s:
        yield s


def test_ttft_and_tpot_match_emission_and_schedule_within_2ms(server):
    """Median over 5 streams within 2 ms; each stream within 10 ms, because CI runs this beside other
    CPU-bound tests on 2 cores and a descheduled process delays one reading by a few ms."""
    ttft_vs_sent, tpot_vs_sent, ttft_vs_schedule, tpot_vs_schedule, late = [], [], [], [], []
    client_late = []  # per stream, how late the client's own loop was (harness.bench.loop_lag): its share of an outlier
    for _ in range(5):
        rec = _run(server, "timed")
        served = server.served[-1]
        assert rec.ok, rec.error
        # Steps: [role-only, 11 tokens, finish, usage, DONE]; sent_ns holds the actual write time of each.
        first_sent, last_sent = served.sent_ns[1], served.sent_ns[11]
        ttft_vs_sent.append(rec.ttft_s - (first_sent - rec.t0_ns) / 1e9)
        tpot_vs_sent.append(rec.tpot_s - (last_sent - first_sent) / 1e9 / 10)
        # TTFT = request transit (t0 -> server read the request) + the scheduled 150 ms.
        ttft_vs_schedule.append(rec.ttft_s - (_transit_s(server, rec) + 0.150))
        # How late the synthetic server's own timer wrote the first token: part of "vs schedule", not the client's.
        late.append((first_sent - served.received_ns) / 1e9 - 0.150)
        tpot_vs_schedule.append(rec.tpot_s - 0.020)
        client_late.append(rec.client_late_s or 0.0)
        assert rec.output_tps == pytest.approx(1 / rec.tpot_s)
    # The schedule check's median takes off each stream's own server lateness (the server's timer, measured by the
    # server): beside the timing run's idle vLLM servers it wrote the first token 0.8 to 5.0 ms late in one
    # fresh-clone run (ci12, 2026-12-03), varying by stream, so the median lateness of an earlier version of this
    # bound (run M, 2026-12-01: errors +1.4..+2.4 ms, all the server's) did not cover a stream late by 3.2 ms.
    ttft_vs_schedule_net = [e - max(0.0, lateness) for e, lateness in zip(ttft_vs_schedule, late)]
    for name, errs in [("ttft vs sent", ttft_vs_sent), ("tpot vs sent", tpot_vs_sent),
                       ("ttft vs schedule, net of the server's lateness", ttft_vs_schedule_net),
                       ("tpot vs schedule", tpot_vs_schedule)]:
        abs_errs = sorted(abs(e) for e in errs)
        assert abs_errs[2] <= TOL_S, (name, errs, f"server late by {late}")
        # Each stream: 10 ms, plus what the client loop measured of its own lateness in that stream (a fresh-clone
        # run, 2026-12-03: one stream 10.1 ms off while the timing run's idle servers shared the cores).
        for err, client in zip(errs, client_late):
            assert abs(err) <= LOADED_TOL_S + client, (name, errs, f"client late by {client_late}")


def test_token_counts_come_exactly_from_final_usage(server):
    rec = _run(server, "timed")
    assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (123, 11, 64)
    assert rec.finish_reason == "length" and rec.done_received


def test_role_only_first_chunk_does_not_start_ttft_but_reasoning_does(server):
    rec = _run(server, "role_then_reasoning")
    assert rec.ok, rec.error
    assert rec.ttft_s == pytest.approx(_transit_s(server, rec) + 0.080, abs=LOADED_TOL_S)


def test_tool_call_delta_counts_as_output(server):
    rec = _run(server, "tool_call_only")
    assert rec.ok, rec.error
    assert rec.ttft_s == pytest.approx(_transit_s(server, rec) + 0.050, abs=LOADED_TOL_S)
    assert rec.tpot_s is None  # a single token has no TPOT


@pytest.mark.parametrize(
    "scenario, failure",
    [
        ("inband_error", "stream_error"),
        ("aborted", "stream_error"),
        ("no_done", "disconnect"),
        ("dropped", "disconnect"),
        ("no_usage", "usage_missing"),
        ("empty", "empty_output"),
        ("http_400", "http_status"),
        ("http_503", "http_status"),
    ],
)
def test_failure_class(server, scenario, failure):
    rec = _run(server, scenario)
    assert rec.failure == failure, rec.error
    assert not rec.ok


def test_http_error_keeps_status_and_body(server):
    rec = _run(server, "http_400")
    assert rec.http_status == 400 and "max_tokens" in rec.error


def test_stalled_stream_is_a_timeout(server):
    rec = _run(server, "stalled", stall_s=0.3)
    assert rec.failure == "timeout"
    assert 0.25 <= (rec.t_end_ns - rec.t0_ns) / 1e9 < 3.0


def test_missing_cached_tokens_is_success_but_never_read_as_zero(server):
    rec = _run(server, "no_cached")
    assert rec.ok and rec.cached_tokens is None
    summary = summarize([rec], Scoring.load())
    assert summary["cache_hit_rate"] is None and summary["weighted_throughput"] is None
    assert summary["cached_tokens_missing"] == 1
    assert any("cached_tokens" in n for n in summary["notes"])


@pytest.mark.slow
def test_client_sustains_thousands_of_events_per_second_on_one_core():
    # The platform's load (c=64 at ~20 tok/s) is ~1300 events/s; the measured figure:
    # reports/bench-and-client-2026-12-01.md.
    from tests.unit.client_throughput import measure

    result = measure(streams=4, events=2000)
    assert result["events"] == 8000
    assert result["events_per_s"] >= 2000, result


def test_t0_is_taken_when_the_request_is_written_not_when_the_call_began(server):
    # The trace hook moves t0 past connection-pool work and TCP connect: a fresh client's first request
    # spends time before writing, and the server must read the request after t0.
    rec = _run(server, "timed")
    received = server.served[-1].received_ns
    assert rec.t_call_ns < rec.t0_ns < received
