"""The metric declarations, the scoring file and the per-run arithmetic (conventions: docs/design.md)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.bench.client import RequestRecord
from harness.errors import HarnessError
from harness.gates.baseline import load_policy
from harness.bench.metrics import REGISTRY, Scoring, percentile, stall_kind, summarize, target_distance


def test_weighted_throughput_reproduces_the_platform_scoring_row():
    # The platform's row for the 100K stable early baseline: output 5.789, input 178.330, cache 512.015 -> 883.11.
    assert round(Scoring.load().weighted(5.789, 178.330, 512.015), 2) == 883.11


def test_scoring_file_has_the_platform_weights_and_targets():
    s = Scoring.load()
    assert (s.w_output, s.w_uncached_input, s.w_cache) == (16.796, 2.799, 0.56)
    assert {k: (t.op, t.value) for k, t in s.targets.items()} == {
        "output_tps_p10": (">=", 20), "ttft_p90": ("<=", 5.0), "cache_hit_rate": (">=", 0.5),
        "success_rate": (">=", 0.99), "weighted_throughput": (">=", 8000),
    }


def test_every_target_bound_points_the_way_of_its_metric_direction():
    for name, t in Scoring.load().targets.items():
        assert REGISTRY[name].direction == ("higher" if t.op == ">=" else "lower"), name


def test_scoring_file_with_unknown_metric_is_refused_naming_it(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("weights: {output: 1, uncached_input: 1, cache: 1}\ntargets: {ttft_p91: {op: '<=', value: 1}}\n")
    with pytest.raises(HarnessError, match="ttft_p91"):
        Scoring.load(bad)


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=50), st.sampled_from([10, 50, 90, 99]))
def test_percentile_is_linear_interpolation_like_numpy(xs, p):
    assert percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)), rel=1e-12, abs=1e-9)


def _rec(i, t0, first, last, end, prompt, completion, cached, failure=None, warmup=False):
    ms = 1_000_000
    return RequestRecord(
        request_id=str(i), endpoint="/v1/chat/completions", t0_ns=t0 * ms, t_first_ns=first * ms,
        t_last_ns=last * ms, t_end_ns=end * ms, http_status=200, done_received=True, finish_reason="length",
        prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached, failure=failure,
        tags={"warmup": warmup},
    )


def test_summary_arithmetic_over_hand_computed_run():
    recs = [
        _rec(0, 0, 100, 1100, 1200, prompt=1000, completion=11, cached=600),  # tpot 100 ms
        _rec(1, 500, 800, 1800, 2000, prompt=500, completion=21, cached=0),  # tpot 50 ms
        _rec(2, 600, 700, 700, 900, prompt=50, completion=1, cached=None, failure="stream_error"),
        _rec(3, -5000, -4000, -3000, -2500, prompt=9999, completion=99, cached=0, warmup=True),
    ]
    s = summarize(recs, Scoring.load())
    assert s["requests"] == 3 and s["successes"] == 2 and s["success_rate"] == pytest.approx(2 / 3)
    assert s["failures"]["stream_error"] == 1
    assert s["duration_s"] == pytest.approx(2.0)  # first send 0 ms to last end 2000 ms; warm-up excluded
    assert s["agg_output_tps"] == pytest.approx(32 / 2.0)
    assert s["uncached_input_tps"] == pytest.approx(900 / 2.0)
    assert s["cache_tps"] == pytest.approx(600 / 2.0)
    assert s["cache_hit_rate"] == pytest.approx(600 / 1500)
    assert s["weighted_throughput"] == pytest.approx(16.796 * 16 + 2.799 * 450 + 0.56 * 300)
    assert s["ttft_p90"] == pytest.approx(percentile([0.1, 0.3], 90))
    assert s["output_tps_p10"] == pytest.approx(percentile([10.0, 20.0], 10))


def test_summary_of_only_failures_has_no_throughput_and_says_why():
    s = summarize([_rec(0, 0, 1, 2, 3, 5, 1, 0, failure="timeout")], Scoring.load())
    assert s["success_rate"] == 0 and s["agg_output_tps"] is None and s["weighted_throughput"] is None
    assert "no successful request" in s["notes"]


def test_target_distance_is_signed_in_the_metric_direction():
    rows = {r["metric"]: r for r in target_distance({"ttft_p90": 6.0, "output_tps_p10": 25.0}, Scoring.load())}
    assert rows["ttft_p90"]["met"] is False and rows["ttft_p90"]["distance"] == pytest.approx(-1.0)
    assert rows["output_tps_p10"]["met"] is True and rows["output_tps_p10"]["distance"] == pytest.approx(5.0)
    assert rows["cache_hit_rate"]["value"] is None and rows["cache_hit_rate"]["met"] is None


def test_record_json_round_trip_keeps_raw_timestamps():
    r = _rec(0, 0, 100, 1100, 1200, 10, 11, 5)
    back = RequestRecord.from_json(r.to_json())
    assert back == r and back.tpot_s == pytest.approx(0.1)


def test_stream_delivered_in_one_burst_is_flagged():
    burst = _rec(0, 0, 500, 500, 501, prompt=10, completion=64, cached=0)  # 64 tokens in 0 ms
    steady = _rec(1, 0, 100, 730, 731, prompt=10, completion=64, cached=0)
    s = summarize([burst, steady], Scoring.load())
    assert s["bursty_requests"] == 1 and any("read in one burst" in n for n in s["notes"])


def _stream(i, offsets_ms, ttft_ms=50):
    """A 200-OK record whose output events arrived at `offsets_ms` after the first one."""
    n = len(offsets_ms)
    r = _rec(i, 0, ttft_ms, ttft_ms + offsets_ms[-1], ttft_ms + offsets_ms[-1] + 1, prompt=10, completion=n,
             cached=0)
    r.output_offsets_us = [int(o * 1000) for o in offsets_ms]
    return r


def test_mid_stream_gap_followed_by_a_burst_is_a_stall_and_a_steady_stream_is_not():
    steady = _stream(0, [5 * k for k in range(64)])
    stalled = _stream(1, [5 * k for k in range(20)] + [95 + 300 + 0.02 * k for k in range(44)])
    assert stall_kind(steady) is None
    assert stall_kind(stalled) == "gap"
    assert stalled.max_gap_s == pytest.approx(0.300, abs=1e-5)


def test_long_gap_without_a_burst_after_it_is_not_a_stall():
    # A tool parser that holds 60 tokens back, then sends one delta and goes on at the decode pace.
    held = _stream(0, [5 * k for k in range(10)] + [45 + 300 + 5 * k for k in range(20)])
    assert stall_kind(held) is None
    s = summarize([held], Scoring.load())
    assert s["stalled_requests"] == 0 and s["gap_over_100ms_requests"] == 1


def _stalled(client_late_s):
    """A stream that waited 900 ms for its first output and 400 ms mid-stream, then read a burst; the client's own
    event loop was late for `client_late_s` of its longest wait (harness.bench.loop_lag; None: not measured)."""
    r = _stream(9, [5 * k for k in range(10)] + [45 + 400 + 0.02 * k for k in range(54)], ttft_ms=900)
    r.client_late_s = client_late_s
    return r


def test_a_stall_the_client_loop_was_late_for_leaves_the_timing_percentiles_when_asked_and_is_counted():
    steady = [_stream(i, [5 * k for k in range(64)], ttft_ms=40) for i in range(3)]
    stalled = _stalled(client_late_s=0.85)
    kept = summarize(steady + [stalled], Scoring.load())
    left_out = summarize(steady + [stalled], Scoring.load(), exclude_stalled=True)
    assert kept["stalled_requests"] == left_out["stalled_requests"] == 1
    assert kept["ttft_p99"] > 0.5 and left_out["ttft_p99"] == pytest.approx(0.040)
    assert left_out["stalled_excluded"] == 1 and kept["stalled_excluded"] == 0
    # Run-level metrics keep every successful request either way.
    assert kept["agg_output_tps"] == left_out["agg_output_tps"] and left_out["successes"] == 4
    assert any("left out of TTFT" in n and "1 of them the client's" in n for n in left_out["notes"])


@pytest.mark.parametrize("client_late_s", [0.0, 0.3, None], ids=["loop-on-time", "loop-late-a-third", "not-measured"])
def test_a_stall_not_shown_to_be_the_clients_is_the_servers_and_stays_in_every_metric(client_late_s):
    steady = [_stream(i, [5 * k for k in range(64)], ttft_ms=40) for i in range(3)]
    s = summarize(steady + [_stalled(client_late_s)], Scoring.load(), exclude_stalled=True)
    assert s["stalled_requests"] == 1 and s["stalled_excluded"] == 0
    assert s["ttft_p99"] > 0.5  # the server's stall is in the platform's metrics


def test_itl_p99_pools_every_gap_between_output_events_over_successful_requests():
    a = _stream(0, [0, 10, 30, 60])  # gaps 10, 20, 30 ms
    b = _stream(1, [0, 5, 45])  # gaps 5, 40 ms
    one_event = _stream(2, [0])  # no gap
    failed = _stream(3, [0, 900])
    failed.failure = "stream_error"
    warm = _stream(4, [0, 700])
    warm.tags["warmup"] = True
    s = summarize([a, b, one_event, failed, warm], Scoring.load())
    # Pooled gaps, sorted: 5, 10, 20, 30, 40 ms; P99 at rank 0.99 * 4 = 3.96: 30 + 0.96 * (40 - 30) = 39.6 ms.
    assert s["itl_p99"] == pytest.approx(0.0396, abs=1e-9)
    assert summarize([one_event], Scoring.load())["itl_p99"] is None


def test_itl_mean_is_tpot_when_each_event_carries_one_token_and_below_it_when_events_carry_several():
    steady = _stream(0, [0, 20, 40, 60, 80])  # 5 events, 5 tokens: 20 ms a token and an event
    assert steady.tpot_s == pytest.approx(0.020)
    assert sum(steady.output_gaps_s) / len(steady.output_gaps_s) == pytest.approx(steady.tpot_s)
    steady.completion_tokens = 9  # the same events carrying two tokens each (after the first)
    assert steady.tpot_s == pytest.approx(0.010)
    assert summarize([steady], Scoring.load())["itl_p99"] == pytest.approx(0.020)


def test_a_stall_leaves_itl_only_when_stalls_leave_the_timing_percentiles():
    steady = _stream(0, [5 * k for k in range(20)])  # 19 gaps of 5 ms
    stalled = _stream(1, [5 * k for k in range(10)] + [445, 445.02, 445.04, 445.06])  # 400 ms, then a burst
    stalled.client_late_s = 0.39  # the client's loop was late for it (harness.bench.loop_lag)
    assert stall_kind(stalled) == "gap"
    # Kept: 32 gaps, the largest 400 ms and the next 5 ms; P99 at rank 0.99 * 31 = 30.69.
    kept = summarize([steady, stalled], Scoring.load())["itl_p99"]
    assert kept == pytest.approx(0.005 + 0.69 * (0.400 - 0.005), abs=1e-6)
    left_out = summarize([steady, stalled], Scoring.load(), exclude_stalled=True)["itl_p99"]
    assert left_out == pytest.approx(0.005)


def test_a_summary_keeps_the_keys_summary_json_has_always_had():
    s = summarize([_stream(0, [0, 10, 20])], Scoring.load()).for_repeat(2)
    assert set(s.to_json()) == {
        "agg_output_tps", "bursty_requests", "cache_hit_rate", "cache_tps", "cached_tokens_missing", "duration_s",
        "e2e_p50", "e2e_p90", "e2e_p99", "failures", "gap_over_100ms_requests", "notes", "output_tps_p10",
        "output_tps_p50", "output_tps_p95", "output_tps_p99", "repeat", "requests", "stalled_excluded",
        "stalled_requests", "success_rate", "successes", "tpot_p50", "tpot_p90", "tpot_p99", "ttft_p50", "ttft_p90",
        "ttft_p95", "ttft_p99", "uncached_input_tps", "weighted_throughput",
        "itl_p99",  # added with the metric
    }
    assert s["repeat"] == 2 and "interrupted" not in s.to_json()
    assert s.for_repeat(2, interrupted=True)["interrupted"] is True
    assert set(s.failures) == {"http_status", "stream_error", "timeout", "disconnect", "empty_output",
                               "usage_missing"}


def test_gated_and_target_metrics_come_from_the_declarations_and_the_files_must_match_them(tmp_path):
    # The five platform metrics: gated, with a target each.
    platform = {"output_tps_p10", "ttft_p90", "cache_hit_rate", "success_rate", "weighted_throughput"}
    assert set(load_policy()) == set(Scoring.load().targets) == platform
    weights = "weights: {output: 1, uncached_input: 1, cache: 1}\n"
    undeclared = tmp_path / "undeclared.yaml"
    undeclared.write_text(weights + "targets: {ttft_p50: {op: '<=', value: 1}}\n")
    with pytest.raises(HarnessError, match=r"\['ttft_p50'\] are not declared for targets"):
        Scoring.load(undeclared)
    partial = tmp_path / "partial.yaml"
    partial.write_text(weights + "targets: {ttft_p90: {op: '<=', value: 5}}\n")
    with pytest.raises(HarnessError, match="no entry for .*'output_tps_p10'"):
        Scoring.load(partial)
    policy = tmp_path / "policy.yaml"
    policy.write_text("gated: {itl_p99: {value: 0.1, scale: relative}}\n")
    with pytest.raises(HarnessError, match=r"\['itl_p99'\] are not declared for gates"):
        load_policy(policy)
