"""Gate and compare over run directories: comparability, verdicts, reports, baseline files."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.bench import datasets as ds
from harness.bench.run import PRESETS, BenchConfig, build_points
from harness.errors import HarnessError
from harness.gates.baseline import Baseline, load_baseline, load_policy, save_baseline, tolerances_for
from harness.gates.compare import compare_runs, comparison_markdown
from harness.gates.decision import Tolerance
from harness.gates.gate import NotComparable, gate, load_run, report_markdown, write_report
from harness.gates.identity import identity_from_manifest, normalise_server_args
from harness.gates.record import baseline_from_runs, for_url_clients
from harness.bench.metrics import Scoring

SCORING = Scoring.load()
COMMAND = "python -m vllm.entrypoints.openai.api_server --model /tmp/x/tiny --port {port} --dtype bfloat16 --max-num-seqs 4"


def repeat(rng, tps=50.0, ttft=0.2, cv=0.03, success=1.0):
    noise = lambda: math.exp(rng.normal(0, cv))  # noqa: E731
    return {"output_tps_p10": tps * noise(), "ttft_p90": ttft * noise(), "cache_hit_rate": 0.5,
            "success_rate": success, "weighted_throughput": 40 * tps * noise(), "agg_output_tps": tps * noise()}


def write_run(tmp_path, name, points, dataset=("decode-micro", "abc"), port=8000, model="tiny", by_url=False):
    """A run directory as `qwen36 bench` writes it: manifest.json and summary.json. `by_url`: as a client
    that knew the server only by its URL writes it (no server command, no model files)."""
    run = tmp_path / name
    run.mkdir()
    manifest = {"model": model, "model_files_sha256": None if by_url else "m1",
                "datasets": [{"name": dataset[0], "sha256": dataset[1]}],
                "server": {"command": None if by_url else COMMAND.format(port=port)}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    summary = {"points": {p: {"repeats": reps} for p, reps in points.items()}}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def make_run(tmp_path, name, points, **kw):
    return load_run(write_run(tmp_path, name, points, **kw))


def baseline_from(run, tolerances=None, floor=None) -> Baseline:
    """A measured baseline of the run's repeats, with per-point tolerances (or `tolerances` for every point)."""
    policy = load_policy()
    tol, noise, notes = tolerances_for(run.points, policy, floor=floor)
    identity = identity_from_manifest(run.manifest) | {"workload": {"preset": "gate"}}
    return Baseline("test", identity, {"source": "measured"}, tolerances or policy, run.points, noise,
                    point_tolerances={} if tolerances else tol, notes=notes, tolerance_floor=floor)


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


def test_candidate_of_fewer_workloads_is_gated_on_those_and_says_which_points_were_not(tmp_path):
    rng = np.random.default_rng(4)
    datasets = [{"name": "decode-micro", "sha256": "abc"}, {"name": "official-like", "sha256": "def"}]
    base = write_run(tmp_path, "base", {"decode@c1": [repeat(rng) for _ in range(3)],
                                        "official@c1": [repeat(rng) for _ in range(3)]})
    manifest = json.loads((base / "manifest.json").read_text())
    (base / "manifest.json").write_text(json.dumps({**manifest, "datasets": datasets}))
    baseline = baseline_from(load_run(base))
    part = make_run(tmp_path, "part", {"decode@c1": [repeat(rng) for _ in range(3)]})  # decode-micro "abc" only
    report = gate(baseline, [part], SCORING)
    assert not report.accepted_differences and {r.point for r in report.rows} == {"decode@c1"}
    assert any("'official@c1' has no candidate: not gated" in n for n in report.notes)
    # A dataset the baseline does not hold is still another setup.
    other = make_run(tmp_path, "other", {"decode@c1": [repeat(rng) for _ in range(3)]}, dataset=("decode-micro", "zzz"))
    with pytest.raises(NotComparable, match="datasets"):
        gate(baseline, [other], SCORING)


def bi_v100_dataset():
    """The dataset preset bi-v100-ledger sends (as against a remote server: prompts sized at 4 chars a token)."""
    (point,) = build_points(BenchConfig(workloads=PRESETS["bi-v100-ledger"]), ds.approx_token_count)
    return point


def test_the_bi_v100_preset_sends_the_workload_its_imported_baseline_measured():
    # 8 requests, concurrency 1, max_tokens 256, cumulative multi-turn with tools, prompts capped at 40K.
    point = bi_v100_dataset()
    items = point.dataset.items
    assert point.name == "official-like@c1" and point.concurrency == 1
    assert len(items) == 8 and {(i.tags["session"], i.tags["turn"]) for i in items} == {
        (s, t) for s in range(2) for t in range(4)}
    assert {i.body["max_tokens"] for i in items} == {256} and all(i.body["tools"] for i in items)
    assert point.dataset.params["prompt_cap_tokens"] == 40000
    assert max(i.tags["est_prompt_tokens"] for i in items) < 40000  # the cap cuts no turn


def test_imported_single_run_baseline_is_compared_conservatively_and_says_so(tmp_path):
    rng = np.random.default_rng(2)
    point = bi_v100_dataset()
    run = make_run(tmp_path, "cand", {point.name: [repeat(rng, tps=6.1, ttft=12.0) for _ in range(3)]},
                   dataset=("official-like", point.dataset.digest), model="served-name-on-the-platform")
    baseline = load_baseline("bi-v100-tp4-245k")
    report = gate(baseline, [run], SCORING)  # a run of preset bi-v100-ledger: no --accept-difference
    md = report_markdown(report)
    assert not report.accepted_differences
    assert "is imported" in md and "baseline is a single run" in md
    assert {r.point for r in report.rows} == {"official-like@c1"} and "point names differ" not in md
    ttft = next(r for r in report.rows if r.metric == "ttft_p90")
    assert ttft.decision.n_baseline == 1 and ttft.decision.baseline == pytest.approx(12.70)
    assert ttft.tolerance == Tolerance(0.10)  # the file's top-level block is the point's default
    other = make_run(tmp_path, "other", {point.name: [repeat(rng) for _ in range(3)]}, dataset=("decode-micro", "x"))
    with pytest.raises(NotComparable, match="datasets"):
        gate(baseline, [other], SCORING)


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
    tol_quiet, _, notes_quiet = tolerances_for(quiet, policy)
    tol_noisy, noise, notes_noisy = tolerances_for(noisy, policy)
    assert tol_quiet["p"]["output_tps_p10"] == policy["output_tps_p10"] and not notes_quiet
    assert tol_noisy["p"]["output_tps_p10"].value > 0.15 and noise["p"]["output_tps_p10"] > 0.1
    assert "over 5 repeats needs" in notes_noisy["p"]["output_tps_p10"]


def test_each_point_gets_its_own_tolerance_and_a_note_when_raised_above_15_percent(tmp_path):
    rng = np.random.default_rng(6)
    run = make_run(tmp_path, "base", {"quiet@c1": [repeat(rng, cv=0.005) for _ in range(5)],
                                      "noisy@c2": [repeat(rng, cv=0.2) for _ in range(5)]})
    baseline = baseline_from(run)
    policy = load_policy()
    assert baseline.tolerance("quiet@c1", "output_tps_p10") == policy["output_tps_p10"]
    assert baseline.tolerance("noisy@c2", "output_tps_p10").value > 0.15
    assert set(baseline.notes) == {"noisy@c2"} and "CV 0.2" in baseline.notes["noisy@c2"]["output_tps_p10"]
    # The quiet point is gated at its own 5%: an 8% drop there is caught though the noisy point needs more.
    cand = make_run(tmp_path, "cand", {"quiet@c1": [repeat(rng, tps=46.0, cv=0.005) for _ in range(5)],
                                       "noisy@c2": [repeat(rng, cv=0.2) for _ in range(5)]})
    report = gate(baseline, [cand], SCORING)
    assert ("quiet@c1", "output_tps_p10") in {(r.point, r.metric) for r in report.regressions}
    assert next(r for r in report.rows if r.point == "quiet@c1" and r.metric == "output_tps_p10").tolerance.value == 0.05
    # ... and the file holds it per point, with the reason.
    save_baseline(baseline, root=tmp_path)
    text = (tmp_path / "test.yaml").read_text()
    assert "    tolerances:\n" in text and "    notes:\n      output_tps_p10: CV 0.2" in text
    again = load_baseline("test", root=tmp_path)
    assert again.point_tolerances == baseline.point_tolerances and again.notes == baseline.notes


def test_a_tolerance_floor_raises_relative_tolerances_only_and_is_written(tmp_path):
    rng = np.random.default_rng(7)
    run_dir = write_run(tmp_path, "base", {"p": [repeat(rng, cv=0.005) for _ in range(5)]})
    baseline = baseline_from_runs("floored", [run_dir], "gate", "test", hardware="here", tolerance_floor=0.08)
    assert baseline.tolerance("p", "output_tps_p10") == Tolerance(0.08)
    assert baseline.tolerance("p", "ttft_p90") == Tolerance(0.10)  # the policy's 10% is above the floor
    assert baseline.tolerance("p", "success_rate") == Tolerance(0.01, "absolute")  # absolute: untouched
    save_baseline(baseline, root=tmp_path)
    assert "tolerance_floor: 0.08" in (tmp_path / "floored.yaml").read_text()
    assert load_baseline("floored", root=tmp_path).tolerance_floor == 0.08
    with pytest.raises(HarnessError, match="tolerance-floor 8"):
        baseline_from_runs("floored", [run_dir], "gate", "test", tolerance_floor=8)


def test_tolerances_are_sized_for_the_candidate_repeats_the_gate_runs():
    rng = np.random.default_rng(8)
    points = {"p": [repeat(rng, cv=0.05) for _ in range(5)]}
    same, _, _ = tolerances_for(points, load_policy())
    three, _, _ = tolerances_for(points, load_policy(), candidate_repeats=3)
    assert three["p"]["ttft_p90"].value > same["p"]["ttft_p90"].value


def test_an_old_style_baseline_uses_its_top_level_tolerances_for_every_point(tmp_path):
    (tmp_path / "old.yaml").write_text(
        "profile: old\nidentity: {workload: {preset: gate}}\nrecorded: {source: imported}\n"
        "tolerances: {ttft_p90: {value: 0.2, scale: relative}}\n"
        "points:\n  a: {repeats: [{ttft_p90: 1.0}]}\n  b: {repeats: [{ttft_p90: 2.0}]}\n")
    b = load_baseline("old", root=tmp_path)
    assert b.tolerance("a", "ttft_p90") == b.tolerance("b", "ttft_p90") == Tolerance(0.2)
    assert b.gated_metrics("a") == ["ttft_p90"]


@pytest.mark.parametrize(("workload", "found"), [("8 requests, concurrency 1", "None"), ({"preset": "nope"}, "'nope'"),
                                                 (None, "None")])
def test_a_baseline_must_name_its_bench_preset(tmp_path, workload, found):
    doc = {"profile": "p", "identity": {"workload": workload}, "recorded": {}, "points": {"a": {"repeats": []}}}
    (tmp_path / "p.yaml").write_text(json.dumps(doc))  # JSON is YAML
    with pytest.raises(HarnessError, match=rf"baseline 'p' .*identity.workload.preset is {found}.*preset: NAME"):
        load_baseline("p", root=tmp_path)


def test_a_relative_tolerance_of_100_percent_on_a_higher_is_better_metric_is_refused(tmp_path):
    doc = {"profile": "p", "identity": {"workload": {"preset": "gate"}}, "recorded": {},
           "points": {"a": {"tolerances": {"output_tps_p10": {"value": 5.09}}, "repeats": []}}}
    (tmp_path / "p.yaml").write_text(json.dumps(doc))
    with pytest.raises(HarnessError, match=r"point 'a', output_tps_p10: relative tolerance 509.0%.*under 1"):
        load_baseline("p", root=tmp_path)


def test_baseline_update_needs_the_flag_and_prints_the_diff(tmp_path):
    b = Baseline("p1", {"model": "m", "workload": {"preset": "gate"}}, {"source": "measured"},
                 {"success_rate": Tolerance(0.01, "absolute")}, {"pt": [{"success_rate": 1.0}]})
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


def test_a_by_url_profile_of_embedded_runs_gates_by_url_candidates_and_still_refuses_another_dataset(tmp_path):
    rng = np.random.default_rng(3)
    embedded = write_run(tmp_path, "embedded", {"decode@c1": [repeat(rng) for _ in range(5)]})
    full = baseline_from_runs("p", [embedded], "gate", how="test")
    by_url = for_url_clients(full)
    candidate = make_run(tmp_path, "cand", {"decode@c1": [repeat(rng) for _ in range(3)]}, by_url=True)
    with pytest.raises(NotComparable, match="server_args"):  # the embedded recording knows what URL clients cannot
        gate(full, [candidate], SCORING)
    assert gate(by_url, [candidate], SCORING).passed
    assert by_url.identity["model_files_sha256"] is None and by_url.identity["server_args"] is None
    assert by_url.identity["datasets"] == full.identity["datasets"] and by_url.points == full.points
    assert "unseen_by_url" in by_url.recorded
    other = make_run(tmp_path, "other", {"decode@c1": [repeat(rng) for _ in range(3)]},
                     dataset=("decode-micro", "xyz"), by_url=True)
    with pytest.raises(NotComparable, match="datasets"):
        gate(by_url, [other], SCORING)


def test_a_tokenizer_given_by_url_sizes_official_like_as_the_model_directory_does(tmp_path):
    """`--tokenizer MODEL_DIR` (by URL) and the embedded server's model directory build the same prompts, so
    their runs share a dataset hash; without a tokenizer the 4-chars estimate builds other prompts."""
    from harness.bench.run import _token_counter
    from harness.serving.tiny_model import TinyRecipe, train_tokenizer

    recipe = TinyRecipe.load()
    train_tokenizer(recipe.seed, recipe.vocab_size).save(str(tmp_path / "tokenizer.json"))
    official = tuple(w for w in PRESETS["gate"] if w.dataset == "official-like")

    def digest(cfg, model_dir=None):
        return build_points(cfg, _token_counter(cfg, model_dir))[0].dataset.digest

    embedded = digest(BenchConfig(workloads=official), model_dir=tmp_path)
    by_url = digest(BenchConfig(workloads=official, base_url="http://h:1", tokenizer=tmp_path))
    by_url_file = digest(BenchConfig(workloads=official, base_url="http://h:1", tokenizer=tmp_path / "tokenizer.json"))
    estimated = digest(BenchConfig(workloads=official, base_url="http://h:1"))
    assert embedded == by_url == by_url_file != estimated
