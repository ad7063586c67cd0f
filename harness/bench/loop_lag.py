"""Whose stall is it? The client loop's own lateness, measured while it reads the streams.

A stream that goes quiet for 100 ms and then delivers a burst (harness.bench.metrics.stall_kind) was either held up
by the server, or sent on time to a client that was not running (descheduled on a shared core: the server's
packets were on the wire the whole time, docs/perf-gates.md). The two look the same in the stream. They do not
look the same to a timer: a task that asks the client's event loop to wake it every INTERVAL_S wakes late by
about the length of the gap when the client was not running, and on time when the server was slow. So the
runner keeps one such task beside the requests (`LoopLag`), and each request records how much of its stall
the loop itself was late for (`attribute`): that much, and only that much, is the client's.
"""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

# 5 ms: 200 wake-ups a second (well under 1% of a core); a stall is at least 100 ms, so it spans 20 of them.
INTERVAL_S = 0.005
# A wake-up later than this is lateness (the loop's own work between two wake-ups takes far less).
LATE_S = 0.010
# A stall is the client's when the loop was late for at least this share of the stall's gap.
CLIENT_SHARE = 0.5


@dataclass
class LoopLag:
    """An asyncio task's record of its own late wake-ups: (when it was due, when it ran), monotonic ns."""
    interval_s: float = INTERVAL_S
    late_s: float = LATE_S
    late: list[tuple[int, int]] = field(default_factory=list)
    started_ns: int | None = None

    async def run(self) -> None:
        self.started_ns = time.monotonic_ns()
        step, late = int(self.interval_s * 1e9), int(self.late_s * 1e9)
        while True:
            due = time.monotonic_ns() + step
            await asyncio.sleep(self.interval_s)
            now = time.monotonic_ns()
            if now - due > late:
                self.late.append((due, now))

    def late_within(self, start_ns: int, end_ns: int) -> int:
        """Nanoseconds of [start_ns, end_ns] during which the loop was late."""
        total = 0
        i = max(0, bisect.bisect_left(self.late, (start_ns, 0)) - 1)
        for due, ran in self.late[i:]:
            if due >= end_ns:
                break
            total += max(0, min(ran, end_ns) - max(due, start_ns))
        return total


@contextlib.asynccontextmanager
async def watching() -> AsyncIterator[LoopLag]:
    """A LoopLag running on the current event loop for the body of the `async with`."""
    lag = LoopLag()
    task = asyncio.create_task(lag.run())
    try:
        yield lag
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def stall_window_ns(rec) -> tuple[int, int] | None:
    """The longest wait of a request, in monotonic ns: its largest gap between two output events, or the wait for
    its first output when that was longer; None before any output."""
    if rec.t_first_ns is None or rec.t0_ns is None:
        return None
    window = (rec.t0_ns, rec.t_first_ns)
    offsets = rec.output_offsets_us
    for before, after in zip(offsets, offsets[1:]):
        if (after - before) * 1000 > window[1] - window[0]:
            window = (rec.t_first_ns + before * 1000, rec.t_first_ns + after * 1000)
    return window


def attribute(records, lag: LoopLag) -> None:
    """Set each record's `client_late_s`: how long the client loop was late during the request's longest wait."""
    for rec in records:
        window = stall_window_ns(rec)
        if window is not None and lag.started_ns is not None and window[0] >= lag.started_ns:
            rec.client_late_s = lag.late_within(*window) / 1e9


def client_caused(rec) -> bool:
    """Whether the record's longest wait was mostly the client loop's lateness (measured: `client_late_s`); a
    request measured without the monitor is not the client's, since nothing shows that it was."""
    window = stall_window_ns(rec)
    late = getattr(rec, "client_late_s", None)
    if window is None or late is None:
        return False
    return late * 1e9 >= CLIENT_SHARE * (window[1] - window[0])
