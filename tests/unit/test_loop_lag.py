"""harness.bench.loop_lag: the client loop's own lateness is measured, and a request's longest wait is the client's
only for the part the loop was late."""
from __future__ import annotations

import asyncio
import time

import pytest

from harness.bench.client import RequestRecord
from harness.bench.loop_lag import LoopLag, attribute, client_caused, stall_window_ns


def record(t0_ns: int, ttft_ms: float, offsets_ms: list[float]) -> RequestRecord:
    r = RequestRecord("r", "/v1/chat/completions", t0_ns=t0_ns, t_first_ns=t0_ns + int(ttft_ms * 1e6))
    r.output_offsets_us = [int(o * 1000) for o in offsets_ms]
    return r


@pytest.mark.timing  # wall-clock bounds of 30 ms and a quiet 20 ms: run alone, not beside the parallel run's load
def test_a_blocked_loop_is_recorded_late_for_about_as_long_as_it_was_blocked():
    lag = LoopLag()

    async def main():
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.05)
        began = time.monotonic_ns()
        time.sleep(0.3)  # the client not running: nothing on its loop advances
        ended = time.monotonic_ns()
        await asyncio.sleep(0.05)
        task.cancel()
        return began, ended

    began, ended = asyncio.run(main())
    assert lag.late_within(began, ended) / 1e9 == pytest.approx(0.3, abs=0.03)
    assert lag.late_within(ended + int(0.02e9), ended + int(0.04e9)) == 0  # on time again after it


def test_the_longest_wait_is_the_first_output_or_the_largest_gap():
    slow_first = record(0, 500, [0, 10, 20])
    assert stall_window_ns(slow_first) == (0, int(500e6))
    gap = record(0, 20, [0, 10, 310, 311])
    assert stall_window_ns(gap) == (int(30e6), int(330e6))
    assert stall_window_ns(RequestRecord("r", "/v1/completions")) is None


def test_a_wait_is_the_clients_only_when_the_loop_was_late_for_most_of_it():
    lag = LoopLag()
    lag.started_ns = 0
    lag.late = [(int(40e6), int(300e6))]  # late for 260 ms of the 300 ms gap below
    theirs = record(0, 20, [0, 10, 310, 311])
    ours_on_time = record(int(1e9), 20, [0, 10, 310, 311])  # a gap while the loop ran on time
    attribute([theirs, ours_on_time], lag)
    assert theirs.client_late_s == pytest.approx(0.26) and client_caused(theirs)
    assert ours_on_time.client_late_s == 0 and not client_caused(ours_on_time)
    unmeasured = record(0, 20, [0, 10, 310, 311])
    assert unmeasured.client_late_s is None and not client_caused(unmeasured)
