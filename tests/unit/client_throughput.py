"""How many streamed SSE events per second our client sustains on one core.

The synthetic server runs in its own process on the other core and sends token events with no delay;
this process is pinned to one core. Run: `python -m tests.unit.client_throughput [STREAMS] [EVENTS]`.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from harness.bench.client import ClientConfig, make_http_client, stream_request
from tests.unit.synthetic_server import Scenario, SyntheticServer, chunk, usage


def flood(events: int, batch: int = 64) -> Scenario:
    """`events` token events with no delay, pre-encoded in batches so the server is not the limit."""
    encoded = [f"data: {json.dumps(chunk(f't{i}'))}\n\n".encode() for i in range(events)]
    steps = [(0.0, b"".join(encoded[i:i + batch])) for i in range(0, events, batch)]
    return Scenario(steps + [(0.0, chunk(finish_reason="length")), (0.0, usage(10, events, 0)), (0.0, "[DONE]")])


def measure(streams: int = 8, events: int = 5000) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = cpus[0], (cpus[1] if len(cpus) > 1 else None)
    with SyntheticServer({"flood": flood(events)}, cpu=server_cpu) as server:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {client_cpu})
        try:
            cfg = ClientConfig(server.url, "flood")

            async def go():
                async with make_http_client(cfg) as http:
                    return await asyncio.gather(*[stream_request(http, cfg, {"prompt": "x"}, str(i))
                                                  for i in range(streams)])

            t, cpu = time.perf_counter(), time.process_time()
            records = asyncio.run(go())
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        finally:
            os.sched_setaffinity(0, before)
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    total = sum(r.output_events for r in records)
    return {"streams": streams, "events": total, "wall_s": wall, "events_per_s": total / wall,
            "client_cpu_busy": cpu / wall,  # near 1.0: the client, not the server, is the limit
            "client_cpu": client_cpu, "server_cpu": server_cpu}


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    print(measure(*args))
