"""Prefix caching off is caught on the cache hit rate: the no-cache server (harness.gates.servers) against the
session's, interleaved on official-like, paired (harness.gates.paired).

A hit rate is the server's count of cached prompt tokens, which the machine's load cannot change (official-like:
about 94% with the cache, 0% without), so this test is not `timing`: it runs in `make test`'s parallel run, and
gates only the hit rate; the timing metrics it measures carry the parallel run's load. The no-cache server wants an
API key (vLLM's --api-key, as a deployment may): its requests carry the session's key, which is also what
tests/bench/test_api_key_server.py checks.
"""
from __future__ import annotations

import pytest

from harness.bench.run import PRESETS
from harness.gates.interleave import Arm, interleave
from harness.gates.paired import paired_gate, report_markdown, write_paired_report
from harness.gates.measure import Warmup, warm
from harness.gates.servers import NO_CACHE, exclusive

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.usefixtures("embedded_server_only")]
# Two pairs: a hit rate has no noise to average (the same in every repeat of a warm server, 0 without a cache).
ROUNDS = 2
POINT = "official-like@c1"
PRESET = "prefix-cache"  # two turns of one official-like session: the hit rate at the least cost


def test_prefix_caching_off_is_caught_on_the_cache_hit_rate(openai_server, compared_servers, tmp_path):
    no_cache = compared_servers[NO_CACHE]
    # The session's prefix cache in its steady state for these prompts (a cold first pass hits less, and the two
    # pairs would then differ). No-cache has no cache state to warm.
    warm(openai_server, Warmup(1, preset=PRESET), tmp_path)
    with exclusive(no_cache):  # the MoE test sends its requests alone
        run = interleave([Arm("session", openai_server), Arm(NO_CACHE, no_cache)], PRESETS[PRESET], ROUNDS, tmp_path,
                         "no-cache")
    report = paired_gate(run.path, "session", NO_CACHE, metrics={POINT: ("cache_hit_rate",)})
    write_paired_report(report, run.path)
    row = report.row(POINT, "cache_hit_rate")
    assert row.verdict == "regression", report_markdown(report)
    assert row.decision.baseline > 0.5 and row.decision.candidate == 0, report_markdown(report)
