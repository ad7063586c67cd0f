"""Gate and compare over run directories: comparability, verdicts, reports, baseline files."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.errors import HarnessError
from harness.gates.baseline import Baseline, load_baseline, load_policy, save_baseline, tolerances_for
from harness.gates.compare import compare_runs, comparison_markdown
from harness.gates.decision import Tolerance
from harness.gates.gate import NotComparable, gate, load_run, report_markdown, write_report
from harness.gates.identity import identity_from_manifest, normalise_server_args
from harness.metrics import Scoring

SCORING = Scoring.load()
COMMAND = "python -m vllm.entrypoints.openai.api_server --model /tmp/x/tiny --port {port} --dtype bfloat16 --max-num-seqs 4"


def repeat(rng, tps=50.0, ttft=0.2, cv=0.03, success=1.0):
    noise = lambda: math.exp(rng.normal(0, cv))  # noqa: E731
    return {"output_tps_p10": tps * noise(), "ttft_p90": ttft * noise(), "cache_hit_rate": 0.5,
            "success_rate": success, "weighted_throughput": 40 * tps * noise(), "agg_output_tps": tps * noise()}


def make_run(tmp_path, name, points, dataset=("decode-micro", "abc"), port=8000, model="tiny"):
    run = tmp_path / name
    run.mkdir()
    manifest = {"model": model, "model_files_sha256": "m1", "datasets": [{"name": dataset[0], "sha256": dataset[1]}],
                "server": {"command": COMMAND.format(port=port)}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    summary = {"points": {p: {"repeats": reps} for p, reps in points.items()}}
    (run / "summary.json").write_text(json.dumps(summary))
    return load_run(run)


def baseline_from(run, tolerances=None) -> Baseline:
    policy = load_policy()
    tol, noise = tolerances_for(run.points, policy)
    return Baseline("test", identity_from_manifest(run.manifest), {"source": "measured"}, tolerances or tol,
                    run.points, noise)


def test_server_args_ignore_port_and_model_path():
    a = normalise_server_args(COMMAND.format(port=8000))
    b = normalise_server_args(COMMAND.format(port=41234).replace("/tmp/x/tiny", "/tmp/y/tiny"))
    assert a == b == ["-m", "vllm.entrypoints.openai.api_server", "--model=<model>", "--dtype", "bfloat16",
                      "--max-num-seqs", "4"]
    assert normalise_server_args(COMMAND.format(port=1) + " --max-num-seqs 1") != a


def test_same_setup_passes_and_an_injected_regression_fails(tmp_path):
    rng = np.random.default_rng(0)
    base = make_run(tmp_path, "base", {"decode@c1": [repeat(rng) for _ in range(5)]})
    same = make_run(tmp_path, "same", {"decode@c1": [repeat(rng) for _ in range(5)]}, port=9000)
    slow = make_run(tmp_path, "slow", {"decode@c1": [repeat(rng, tps=40.0, ttft=0.3) for _ in range(5)]})
    baseline = baseline_from(base)
    assert gate(baseline, [same], SCORING).passed
    report = gate(baseline, [slow], SCORING)
    assert not report.passed
    assert {r.metric for r in report.regressions} >= {"output_tps_p10", "ttft_p90", "weighted_throughput"}
    md = report_markdown(report)
    assert "REGRESSION" in md and "| decode@c1 | output_tps_p10 |" in md and ">= 20: met" in md
    md_path, json_path = write_report(report, tmp_path / "gate")
    assert json.loads(json_path.read_text())["passed"] is False and md_path.read_text() == md


def test_other_dataset_is_refused_with_the_difference_named_unless_accepted(tmp_path):
    rng = np.random.default_rng(1)
    base = make_run(tmp_path, "base", {"p": [repeat(rng) for _ in range(3)]})
    other = make_run(tmp_path, "other", {"p": [repeat(rng) for _ in range(3)]}, dataset=("decode-micro", "zzz"))
    baseline = baseline_from(base)
    with pytest.raises(NotComparable, match=r"datasets: baseline .*'abc'.* vs candidate .*'zzz'"):
        gate(baseline, [other], SCORING)
    report = gate(baseline, [other], SCORING, accept=["datasets"])
    assert any("datasets" in d for d in report.accepted_differences)
    assert "accepted difference: datasets" in report_markdown(report)
    with pytest.raises(ValueError, match="not an identity field"):
        gate(baseline, [other], SCORING, accept=["dataset"])


def test_imported_single_run_baseline_is_compared_conservatively_and_says_so(tmp_path):
    rng = np.random.default_rng(2)
    run = make_run(tmp_path, "cand", {"official-like@c1": [repeat(rng, tps=6.1, ttft=12.0) for _ in range(3)]},
                   dataset=("official-like", "d1"), model="Qwen3.6-35B-A3B")
    baseline = load_baseline("bi-v100-tp4-245k")
    with pytest.raises(NotComparable, match="datasets"):
        gate(baseline, [run], SCORING)
    report = gate(baseline, [run], SCORING, accept=["datasets"])
    md = report_markdown(report)
    assert "is imported" in md and "baseline is a single run" in md
    assert "the only baseline point 'synthetic_cumulative_8_s3_cap40k@c1'" in md
    ttft = next(r for r in report.rows if r.metric == "ttft_p90")
    assert ttft.decision.n_baseline == 1 and ttft.decision.baseline == pytest.approx(12.70)


def test_compare_reports_ratios_geomean_and_capacity_gained(tmp_path):
    rng = np.random.default_rng(3)
    failed = [dict(repeat(rng), success_rate=0.0, output_tps_p10=None)]
    a = make_run(tmp_path, "a", {"c1": [repeat(rng, tps=10)], "c2": [repeat(rng, tps=20)], "c8": failed})
    b = make_run(tmp_path, "b", {"c1": [repeat(rng, tps=20, cv=0)], "c2": [repeat(rng, tps=20, cv=0)],
                                 "c8": [repeat(rng)]})
    c = compare_runs(a, b)
    assert c.capacity_gained == ["c8"] and "c8" not in c.ratios
    assert c.ratios["c2"]["output_tps_p10"] == pytest.approx(20 / a.points["c2"][0]["output_tps_p10"])
    expected = math.sqrt(c.ratios["c1"]["output_tps_p10"] * c.ratios["c2"]["output_tps_p10"])
    assert c.geomean["output_tps_p10"] == pytest.approx(expected)
    assert "capacity gained" in comparison_markdown(c)


def test_tolerances_rise_to_what_the_noise_can_resolve():
    rng = np.random.default_rng(4)
    quiet = {"p": [repeat(rng, cv=0.005) for _ in range(5)]}
    noisy = {"p": [repeat(rng, cv=0.2) for _ in range(5)]}
    policy = load_policy()
    tol_quiet, _ = tolerances_for(quiet, policy)
    tol_noisy, noise = tolerances_for(noisy, policy)
    assert tol_quiet["output_tps_p10"] == policy["output_tps_p10"]
    assert tol_noisy["output_tps_p10"].value > 0.15 and noise["p"]["output_tps_p10"] > 0.1


def test_baseline_update_needs_the_flag_and_prints_the_diff(tmp_path):
    b = Baseline("p1", {"model": "m"}, {"source": "measured"}, {"success_rate": Tolerance(0.01, "absolute")},
                 {"pt": [{"success_rate": 1.0}]})
    save_baseline(b, root=tmp_path)
    with pytest.raises(HarnessError, match="pass --update"):
        save_baseline(b, root=tmp_path)
    b.points["pt"].append({"success_rate": 0.9})
    diff = save_baseline(b, root=tmp_path, update=True)
    assert "+    - {success_rate: 0.9}" in diff
    assert load_baseline("p1", root=tmp_path).values("pt", "success_rate") == [1.0, 0.9]


def test_missing_run_files_and_unknown_profiles_are_named(tmp_path):
    with pytest.raises(HarnessError, match="manifest.json is missing"):
        load_run(tmp_path)
    with pytest.raises(HarnessError, match="known profiles: .*bi-v100-tp4-245k"):
        load_baseline("nope")
