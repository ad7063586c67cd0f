"""A baseline recorded on one day, gated against runs made on another: rescaled by harness.machine.speed's probe.

The 2-core CI VM drifts by more than the tolerance between days (docs/perf-gates.md, "drift"): on 2026-12-02
CI's slower decode read only -23.6% against the baseline as recorded and passed, and on 2026-12-03 the same
slower server ran twice as fast as the recording's normal one.
"""
from __future__ import annotations

import json
import platform

import numpy as np
import pytest

from harness.gates.gate import NotComparable, gate, load_run, report_markdown
from harness.gates.record import baseline_from_runs
from harness.machine.speed import MAX_FACTOR, PROBE, machine_kind
from harness.bench.metrics import REGISTRY
from harness.gates.gate import rescaled
from tests.unit.test_gate_runs import SCORING, baseline_from, make_run, repeat, write_run

RECORDED_RATE = 400.0
KIND = ("x86_64, 2 CPUs, GenuineIntel 6 167, avx2 avx512f avx512_bf16 avx512_fp16 amx_tile amx_bf16, AMX usable, "
        "kernel 6.18.44-fc-v1147")


def speed(rate: float, probe: str = PROBE, machine: str = KIND) -> dict:
    return {"probe": probe, "unit": "steps/s", "rate": rate, "machine": machine}


def with_speed(run_dir, machine_speed):
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "machine_speed": machine_speed}))
    return load_run(run_dir)


@pytest.fixture
def recorded(tmp_path):
    rng = np.random.default_rng(1)
    run = make_run(tmp_path, "base", {"decode@c2": [repeat(rng, tps=64.0, ttft=0.29) for _ in range(5)]})
    baseline = baseline_from(run, floor=0.2)  # cpu-tiny's floor
    baseline.machine_speed = speed(RECORDED_RATE)
    return baseline


def candidate(tmp_path, name, tps, ttft, rate, seed=2, **speed_kw):
    rng = np.random.default_rng(seed)
    run_dir = write_run(tmp_path, name, {"decode@c2": [repeat(rng, tps=tps, ttft=ttft) for _ in range(3)]},
                        port=9000)
    return with_speed(run_dir, speed(rate, **speed_kw) if rate else None)


def test_on_a_faster_day_a_slower_decode_is_still_a_regression(recorded, tmp_path):
    # the machine 1.53x as fast (98/64), the server 44% slower than the machine allows: 55 tok/s, -14% as recorded
    slow = candidate(tmp_path, "slow", tps=55.0, ttft=0.19 * 1.6, rate=RECORDED_RATE * 98 / 64)
    as_recorded = gate(recorded, [candidate(tmp_path, "slow-unprobed", 55.0, 0.19 * 1.6, None)], SCORING)
    assert as_recorded.passed, report_markdown(as_recorded)
    report = gate(recorded, [slow], SCORING)
    assert {"output_tps_p10", "weighted_throughput", "ttft_p90"} <= {r.metric for r in report.regressions}
    assert report.speed_factor == pytest.approx(98 / 64)
    row = next(r for r in report.rows if r.metric == "output_tps_p10")
    assert row.decision.change == pytest.approx(55 / 98 - 1, abs=0.05)
    assert "machine speed: the probe ran at 612.5 steps/s here, 400 when the baseline was recorded (x1.531)" \
        in report_markdown(report)


def test_on_a_slower_day_the_same_server_passes(recorded, tmp_path):
    # the machine at 70% of the recording day's speed, the server with it: -30% as recorded, the control's false alarm
    same = candidate(tmp_path, "same", tps=64.0 * 0.7, ttft=0.29 / 0.7, rate=RECORDED_RATE * 0.7)
    assert not gate(recorded, [candidate(tmp_path, "unprobed", 64.0 * 0.7, 0.29 / 0.7, None)], SCORING).passed
    report = gate(recorded, [same], SCORING)
    assert report.passed, report_markdown(report)
    assert json.loads(json.dumps(report.as_dict()))["speed_factor"] == pytest.approx(0.7)


def test_counts_and_ratios_are_not_rescaled():
    factor = 1.5
    assert rescaled([0.944], REGISTRY["cache_hit_rate"], factor) == [0.944]
    assert rescaled([1.0], REGISTRY["success_rate"], factor) == [1.0]
    assert rescaled([2.0], REGISTRY["ttft_p90"], factor) == [pytest.approx(2.0 / factor)]
    assert rescaled([60.0], REGISTRY["output_tps_p10"], factor) == [pytest.approx(90.0)]
    assert rescaled([2000.0], REGISTRY["weighted_throughput"], factor) == [pytest.approx(3000.0)]
    assert rescaled([2.0], REGISTRY["ttft_p90"], None) == [2.0]


def test_without_a_candidate_probe_or_with_another_probe_it_compares_as_recorded_and_says_why(recorded, tmp_path):
    unprobed = gate(recorded, [candidate(tmp_path, "a", 64.0, 0.29, None)], SCORING)
    assert unprobed.speed_factor is None
    assert "a candidate run did not" in report_markdown(unprobed) and "not rescaled" in report_markdown(unprobed)
    other = gate(recorded, [candidate(tmp_path, "b", 64.0, 0.29, RECORDED_RATE, probe="another-probe-v9")], SCORING)
    assert other.speed_factor is None and "the speed probes differ" in report_markdown(other)


def test_a_baseline_without_a_probe_is_compared_as_recorded_silently(recorded, tmp_path):
    recorded.machine_speed = None
    report = gate(recorded, [candidate(tmp_path, "a", 64.0, 0.29, RECORDED_RATE * 1.5)], SCORING)
    assert report.speed_factor is None and "machine speed" not in report_markdown(report)


@pytest.mark.parametrize("factor", [1 / MAX_FACTOR * 0.9, MAX_FACTOR * 1.1])
def test_a_probe_beyond_the_largest_drift_seen_is_another_machine_and_refused(recorded, tmp_path, factor):
    with pytest.raises(NotComparable, match="another machine, not another day"):
        gate(recorded, [candidate(tmp_path, "far", 64.0, 0.29, RECORDED_RATE * factor)], SCORING)


def test_a_probe_taken_on_a_busy_machine_does_not_rescale(recorded, tmp_path):
    # the probe read x0.49 beside a busy process on each core while the server did not slow down (2026-12-03)
    run = candidate(tmp_path, "busy", 64.0 * 0.45, 0.29, RECORDED_RATE * 0.49)
    manifest = json.loads((run.path / "manifest.json").read_text())
    manifest["machine_speed"]["busy"] = True
    (run.path / "manifest.json").write_text(json.dumps(manifest))
    report = gate(recorded, [load_run(run.path)], SCORING)
    assert report.speed_factor is None and "busy with other work" in report_markdown(report)
    assert "output_tps_p10" in {r.metric for r in report.regressions}


def test_a_baseline_of_another_kind_of_machine_is_refused_even_at_the_same_speed(recorded, tmp_path):
    other_kind = KIND.replace("fc-v1147", "fc-v1045")
    with pytest.raises(NotComparable, match="another kind of machine"):
        gate(recorded, [candidate(tmp_path, "k", 64.0, 0.29, RECORDED_RATE, machine=other_kind)], SCORING)


def test_machine_kind_names_the_cpu_the_extensions_that_choose_the_kernels_and_the_kernel():
    cpuinfo = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
               "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16 avx512_vnni\n")
    kind = machine_kind(cpuinfo, amx_usable=False)
    expected = "GenuineIntel 6 143, avx2 avx512f avx512_bf16 amx_tile amx_bf16, AMX not usable"
    assert f"{expected}, kernel {platform.release()}" in kind
    assert machine_kind(cpuinfo.replace(" avx512_bf16", ""), amx_usable=False) != kind


def test_a_recorded_baseline_keeps_the_median_probe_of_its_runs_and_the_file_round_trips(tmp_path):
    from harness.gates.baseline import load_baseline, save_baseline

    rng = np.random.default_rng(3)
    dirs = []
    for i, rate in enumerate((390.0, 410.0, 400.5)):
        d = write_run(tmp_path, f"r{i}", {"decode@c2": [repeat(rng) for _ in range(3)]})
        with_speed(d, {**speed(rate), "before": {}, "after": {}})
        dirs.append(d)
    baseline = baseline_from_runs("probed", dirs, "gate", "test")
    assert baseline.machine_speed == speed(400.5)
    save_baseline(baseline, tmp_path / "baselines")
    assert load_baseline("probed", tmp_path / "baselines").machine_speed == speed(400.5)
    with_speed(dirs[1], None)
    assert baseline_from_runs("mixed", dirs, "gate", "test").machine_speed is None
