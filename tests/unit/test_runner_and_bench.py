"""The runner and `qwen36 bench` end to end against the synthetic server (no vLLM needed)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from harness.bench.run import BenchConfig, Workload, run_bench
from harness.bench.client import ClientConfig
from harness.bench.datasets import decode_micro
from harness.bench.metrics import Scoring
from harness.bench.runner import Point, SweepPolicy, run_points, sweep_stop_reason
from tests.unit.synthetic_server import Scenario, SyntheticServer, normal_stream


@pytest.fixture(scope="module")
def server():
    scenarios = {"fast": normal_stream(0.005, 0.001, 8), "slow": normal_stream(0.05, 0.01, 16),
                 "down": Scenario(status=503)}
    with SyntheticServer(scenarios) as s:
        yield s


def _max_overlap(records) -> int:
    events = sorted([(r.t0_ns, 1) for r in records] + [(r.t_end_ns, -1) for r in records])
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def test_fixed_concurrency_keeps_exactly_c_requests_in_flight(server):
    cfg = ClientConfig(server.url, "slow")
    results, reason = run_points(cfg, [Point("p", decode_micro(0, requests=6, warmup=0), 2)], Scoring.load(),
                                 show_progress=False)
    recs = results[0].records
    assert reason == "completed" and len(recs) == 6 and all(r.ok for r in recs)
    assert _max_overlap(recs) == 2


def test_warmup_is_excluded_and_each_repeat_is_summarised(server):
    cfg = ClientConfig(server.url, "fast")
    results, _ = run_points(cfg, [Point("p", decode_micro(0, requests=3, warmup=2), 1, repeats=2)],
                            Scoring.load(), show_progress=False)
    res = results[0]
    assert sum(1 for r in res.records if r.tags["warmup"]) == 4
    assert [s["requests"] for s in res.summaries] == [3, 3]
    assert [s["repeat"] for s in res.summaries] == [0, 1]


@pytest.mark.parametrize("prev, cur, alive, reason", [
    (None, {"success_rate": 1.0, "ttft_p90": 1, "agg_output_tps": 10}, False, "server_crash"),
    (None, {"success_rate": 0.9, "ttft_p90": 1, "agg_output_tps": 10}, True, "error_rate"),
    (None, {"success_rate": 1.0, "ttft_p90": 9, "agg_output_tps": 10}, True, "ttft_slo_exceeded"),
    ({"agg_output_tps": 10}, {"success_rate": 1.0, "ttft_p90": 1, "agg_output_tps": 9}, True, "throughput_regressing"),
    ({"agg_output_tps": 10}, {"success_rate": 1.0, "ttft_p90": 1, "agg_output_tps": 10.2}, True, "throughput_saturated"),
    ({"agg_output_tps": 10}, {"success_rate": 1.0, "ttft_p90": 1, "agg_output_tps": 15}, True, None),
])
def test_sweep_stop_reasons(prev, cur, alive, reason):
    assert sweep_stop_reason(prev, cur, SweepPolicy(ttft_slo_s=5), alive) == reason


def test_bench_writes_the_whole_run_directory(server, tmp_path):
    cfg = BenchConfig(workloads=(Workload("decode-micro", (1, 2), requests=4, output_tokens=8),),
                      base_url=server.url, model="fast", out_root=tmp_path, show_progress=False)
    run_dir = run_bench(cfg)
    for name in ("manifest.json", "requests.jsonl", "summary.json", "report.md", "plot.png"):
        assert (run_dir / name).stat().st_size > 0, name
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["harness"]["version"] and manifest["datasets"][0]["sha256"]
    assert [p["name"] for p in manifest["points"]] == ["decode-micro@c1", "decode-micro@c2"]
    lines = [json.loads(l) for l in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * (4 + 2)  # measured + warm-up, both recorded with raw timestamps
    assert all(l["t0_ns"] and l["t_first_ns"] for l in lines)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["points"]["decode-micro@c1"]["table"]["success_rate"] == 1.0
    report = (run_dir / "report.md").read_text()
    assert "Distance to the platform targets" in report and "weighted_throughput" in report


def test_ctrl_c_still_writes_what_was_measured(server, tmp_path):
    cmd = [sys.executable, "-m", "harness.cli", "bench", "--base-url", server.url, "--model", "slow",
           "--dataset", "decode-micro", "--requests", "200", "--out", str(tmp_path), "--no-progress"]
    already = len(server.served)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    # Interrupt once the measured phase is under way (2 warm-up requests, then measured ones).
    while len(server.served) < already + 5 and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    run_dir = next(tmp_path.glob("*-decode-micro"))
    measured = [json.loads(l) for l in (run_dir / "requests.jsonl").read_text().splitlines()
                if not json.loads(l)["tags"]["warmup"]]
    assert 0 < len(measured) < 200 and all(r["ok"] for r in measured)
    assert json.loads((run_dir / "summary.json").read_text())["end_reason"] == "interrupted"
    assert "interrupted" in (run_dir / "report.md").read_text() and "run ended: interrupted" in out


def test_sweep_stops_at_the_first_point_with_errors_and_says_why(server, tmp_path):
    cfg = BenchConfig(workloads=(Workload("decode-micro", (1, 2, 4), requests=4, output_tokens=8),),
                      base_url=server.url, model="down", out_root=tmp_path, show_progress=False, sweep=True)
    summary = json.loads((run_bench(cfg) / "summary.json").read_text())
    assert summary["end_reason"] == "error_rate"
    assert list(summary["points"]) == ["decode-micro@c1"]
    assert summary["points"]["decode-micro@c1"]["table"]["failures"]["http_status"] == 4


def test_sweep_that_keeps_scaling_ends_with_max_reached(server, tmp_path):
    # The synthetic server's timing does not depend on load, so throughput doubles with concurrency.
    cfg = BenchConfig(workloads=(Workload("decode-micro", (1, 2, 4), requests=8, output_tokens=16),),
                      base_url=server.url, model="slow", out_root=tmp_path, show_progress=False, sweep=True)
    summary = json.loads((run_bench(cfg) / "summary.json").read_text())
    assert summary["end_reason"] == "max_reached" and len(summary["points"]) == 3


def test_a_run_records_the_machine_speed_probe_and_a_failing_probe_costs_only_the_rescaling(server, tmp_path,
                                                                                          monkeypatch, capsys):
    import harness.bench.run as bench
    from harness.machine.speed import MachineSpeed

    cfg = BenchConfig(workloads=(Workload("decode-micro", (1,), requests=2, output_tokens=4),),
                      base_url=server.url, model="fast", out_root=tmp_path, show_progress=False, machine_speed=True)
    rates = iter((200.0, 220.0))
    monkeypatch.setattr(bench, "measure_machine_speed", lambda: MachineSpeed("p", next(rates), 0.01, (0,)))
    speed = json.loads((run_bench(cfg) / "manifest.json").read_text())["machine_speed"]
    assert speed["probe"] == "p" and speed["rate"] == pytest.approx(210.0)

    def broken():
        raise subprocess.CalledProcessError(1, "probe")

    monkeypatch.setattr(bench, "measure_machine_speed", broken)
    run_dir = run_bench(cfg)
    assert json.loads((run_dir / "manifest.json").read_text())["machine_speed"] is None
    assert len((run_dir / "requests.jsonl").read_text().splitlines()) == 2 + 2  # warm-up and measured, kept
    assert "the machine speed probe failed" in capsys.readouterr().err
