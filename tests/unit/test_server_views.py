"""The server-side (Prometheus) and hardware views."""
from __future__ import annotations

import stat
import time

import pytest

from harness.machine import prometheus
from harness.machine.hardware import HardwareSampler, parse_csv, summarize_samples

BEFORE = """# HELP vllm:prefix_cache_queries_total x
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.5
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 5.0
"""
AFTER = BEFORE.replace("} 100.0", "} 1100.0").replace("hits_total{engine=\"0\",model_name=\"m\"} 10.0",
                                                       "hits_total{engine=\"0\",model_name=\"m\"} 510.0") \
    .replace("seconds_sum{engine=\"0\",model_name=\"m\"} 0.5", "seconds_sum{engine=\"0\",model_name=\"m\"} 2.5") \
    .replace("seconds_count{engine=\"0\",model_name=\"m\"} 5.0", "seconds_count{engine=\"0\",model_name=\"m\"} 15.0")


def test_prometheus_deltas_sum_label_sets_and_give_the_server_hit_rate():
    d = prometheus.deltas(prometheus.parse(BEFORE), prometheus.parse(AFTER))
    assert d["prefix_cache_queries"] == 1000 and d["prefix_cache_hits"] == 500
    assert d["server_prefix_cache_hit_rate"] == pytest.approx(0.5)
    assert d["preemptions"] == 0 and d["mean_queue_time_s"] == pytest.approx(0.2)


def test_hit_rate_disagreement_is_flagged_only_beyond_the_threshold():
    assert prometheus.compare_hit_rates(0.50, 0.52) is None
    assert "disagrees" in prometheus.compare_hit_rates(0.50, 0.10)
    assert prometheus.compare_hit_rates(None, 0.1) is None


def test_hardware_csv_parses_na_as_missing():
    rows = parse_csv("0, 29, 1000, 32000, 50.5, 250\n1, [N/A], 900, 32000, [N/A], 250\n")
    assert rows[0]["util_pct"] == 29 and rows[0]["power_w"] == 50.5
    assert rows[1]["util_pct"] is None


def test_sampler_runs_a_smi_tool_and_summarises_per_device(tmp_path):
    tool = tmp_path / "ixsmi"
    tool.write_text("#!/bin/sh\necho '0, 20, 100, 32000, 40, 250'\necho '1, 40, 300, 32000, 60, 250'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "hardware.jsonl"
    with HardwareSampler(out, tool=str(tool), period_s=0.05):
        time.sleep(0.3)
    s = summarize_samples(out)
    assert set(s) == {"0", "1"} and s["0"]["samples"] >= 2
    assert s["1"]["util_pct"] == {"mean": 40, "max": 40} and s["0"]["power_w"]["max"] == 40


def test_no_sampler_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with HardwareSampler(tmp_path / "hw.jsonl") as s:
        assert s.tool is None
    assert summarize_samples(tmp_path / "hw.jsonl") is None
