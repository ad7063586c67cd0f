"""The bench's metrics table: its rows come from the metric declarations, in their order."""
from __future__ import annotations

from harness.bench.client import RequestRecord
from harness.bench.metrics import Scoring, shown_in, summarize
from harness.bench.report import metrics_table


def test_the_table_has_one_row_per_declared_table_metric_in_declaration_order():
    ms = 1_000_000
    record = RequestRecord(request_id="0", endpoint="/v1/chat/completions", t0_ns=0, t_first_ns=100 * ms,
                           t_last_ns=130 * ms, t_end_ns=131 * ms, http_status=200, done_received=True,
                           finish_reason="stop", prompt_tokens=10, completion_tokens=3, cached_tokens=4,
                           output_offsets_us=[0, 10_000, 30_000])
    scoring = Scoring.load()
    lines = metrics_table([("p", summarize([record], scoring))], scoring).splitlines()
    rows = [line.split("|")[1].split()[0] for line in lines[2:]]
    assert rows == list(shown_in("table"))
    assert "ttft_p50" in rows and "ttft_p95" not in rows and "successes" not in rows
    # Units, arrows and targets from the declarations: TPOT 30 ms / 2 tokens, TTFT 100 ms against <= 5 s.
    assert "| tpot_p50 ↓ (s) | 15.0 ms |  |" in lines
    assert "| ttft_p90 ↓ (s) | 100.0 ms ✓ | <= 5.00 s |" in lines
