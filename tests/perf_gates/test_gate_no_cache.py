"""The server without prefix caching, gated by URL against the committed `cpu-tiny` baseline: caught on the
cache hit rate, and the live gate's pytest exits 1.

This is the live path's failing side (`tests/perf_gates/test_gate_live.py` in a nested pytest that knows the
server only by its URL and the model's tokenizer; the two identity fields such a client cannot see are
accepted, as docs/perf-gates.md tells a user to) and the committed baseline's prefix-caching regression at
once. Its passing side is test_gate_tiny_server.py's control, the same command against the session's server.

The server is harness.gates.regressions' no-cache: `--enforce-eager` as well, which a count of cached tokens
cannot see. The MoE substitution test uses it too (its "off" side); each holds it (`exclusive`)
while it sends requests.

Not a `timing` test: the hit rate is the server's count of cached prompt tokens, which the machine's load
cannot change (official-like: 94.4% with the cache, 0% without). So it runs in `make test`'s parallel run, and
its full prefills are not paid in the timing run
(220-260 s in the parallel run, beside the session server's tests, in runs BB-EE and FF-GG of
reports/ci-2026-12-02.md). Only the hit rate is asserted: the TTFT P90 this run measures would carry the parallel
run's load too; a slower prefill on TTFT is
test_gate_tiny_server.py's `test_slower_prefill_is_caught_on_ttft`, measured alone.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.gates.record import UNSEEN_BY_URL
from harness.gates.regressions import NO_CACHE, exclusive
from tests.perf_gates.live_gate import live_gate

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.usefixtures("embedded_server_only")]
PROFILE = "cpu-tiny"
# One repeat: the gate takes the noise from the baseline's repeats, and a 94-point drop stands far beyond the
# 2-point tolerance.
REPEATS = 1


def test_live_gate_by_url_fails_without_prefix_caching_on_cache_hit_rate(openai_server, regressed_servers,
                                                                          tmp_path):
    server = regressed_servers[NO_CACHE]
    with exclusive(server):
        # No speed probe: beside the parallel run's workers it would measure their load, and a count of cached
        # tokens needs no rescaling.
        run = live_gate(server.base_url, PROFILE, tmp_path / "no-cache", REPEATS, Path(openai_server.model_dir),
                        accept=UNSEEN_BY_URL, machine_speed=False)
    assert run.process.returncode == 1, run.output()
    assert run.failed("cache_hit_rate"), run.output()
    assert (run.run / "gate.json").exists()  # the report lands in the run directory
