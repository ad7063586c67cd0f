"""The history store: records are validated, kept one file per run, added once, and read back equal."""
from __future__ import annotations

import json

import pytest

from harness.errors import HarnessError
from harness.history.record import Figure, Machine, Record, RecordError
from harness.history.site.catalog import metric_catalog
from harness.history.site.catalog import Metric
from harness.history.site.directions import asv_threshold, drawable, from_asv, reciprocal_threshold, to_asv
from harness.history.store import HistoryStore

SHA = "a" * 40


def record(value=1.0, *, unit="us", direction="lower", date="2026-12-01", threshold=0.05, source="runs/x/check.json"):
    return Record("tune-check", date, SHA, "run manifest", Machine("gpu: NVIDIA H200"), "qwen36 tune --check",
                  source, (Figure("gpu.add_rms_norm.triton.t1.graph_us", value, unit, direction, threshold=threshold),))


def test_a_record_round_trips_through_the_store_and_is_added_once(tmp_path):
    store = HistoryStore(tmp_path / "records")
    written, present = store.add([record()])
    assert len(written) == 1 and not present
    written, present = store.add([record()])
    assert not written and len(present) == 1
    assert list(store.records()) == [record()]
    assert json.loads(present[0].read_text())["schema"] == "qwen36-history/1"


@pytest.mark.parametrize("bad, words", [
    (dict(metric="Decode Step"), "dotted lowercase"),
    (dict(value=float("nan")), "finite"),
    (dict(direction="up"), "direction"),
    (dict(threshold=0.0), "threshold"),
])
def test_a_bad_figure_is_refused_with_what_to_fix(bad, words):
    fields = dict(metric="gpu.x.y_us", value=1.0, unit="us", direction="lower") | bad
    with pytest.raises(RecordError, match=words):
        Figure(**fields)


def test_a_record_needs_a_full_commit_hash_and_a_date():
    with pytest.raises(RecordError, match="40-hex"):
        Record("k", "2026-12-01", "abc123", "", Machine("m"), "", "s", record().figures)
    with pytest.raises(RecordError, match="YYYY-MM-DD"):
        Record("k", "yesterday", SHA, "", Machine("m"), "", "s", record().figures)


def test_a_broken_record_file_names_itself(tmp_path):
    store = HistoryStore(tmp_path)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(RecordError, match="bad.json"):
        list(store.records())


def test_the_latest_record_sets_a_metrics_threshold_and_a_changed_unit_is_refused():
    catalog = metric_catalog([record(threshold=0.10, date="2026-12-02"), record(threshold=0.05, date="2026-12-01")])
    assert catalog["gpu.add_rms_norm.triton.t1.graph_us"].threshold == 0.10
    with pytest.raises(HarnessError, match="new metric name"):
        metric_catalog([record(), record(unit="ms", date="2026-12-02")])


def test_a_drop_is_the_matching_rise_of_the_reciprocal():
    # 15% less throughput is 1/0.85 - 1 = 17.6% more time per token: the same line, judged the same.
    assert reciprocal_threshold(0.15) == pytest.approx(1 / 0.85 - 1)


def test_a_rate_goes_to_asv_linearly_and_keeps_its_zero():
    rate = Metric("bench.decode.c2.cache_hit_rate", "ratio", "higher", 0.05, True, ())
    tps = Metric("bench.decode.c2.output_tps_p10", "tok/s", "higher", 0.05, True, ())
    time = Metric("bench.decode.c2.ttft_p90", "s", "lower", 0.05, True, ())
    for metric, xs in ((rate, (0.0, 0.3, 1.0)), (tps, (0.5, 50.0)), (time, (0.0, 0.2))):
        for x in xs:
            assert drawable(x, metric) and from_asv(to_asv(x, metric), metric) == pytest.approx(x)
    assert to_asv(0.2, rate) > to_asv(0.3, rate) and to_asv(40.0, tps) > to_asv(50.0, tps)  # worse is up
    assert not drawable(0.0, tps)
    # A drop of the rate by its tolerance is at least asv's threshold on 2 - x, wherever the rate is.
    for x in (0.05, 0.5, 1.0):
        rise = (to_asv(x - 0.05, rate) - to_asv(x, rate)) / to_asv(x, rate)
        assert rise >= asv_threshold(rate) - 1e-12
