"""From the harness's run outputs to history records (harness/history/sources, harness/history/backfill.py): each run
kind read from a small run directory made with its writer's own fields (by the writer's functions where they need
no device or server, else a real report trimmed), the machine kinds, the commits, and the backfill of this
repository's own history."""
from __future__ import annotations

import ast
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.bench.metrics import RunSummary
from harness.errors import HarnessError
from harness.gates.decision import Tolerance, decide
from harness.gates.gate import GateReport, GateRow, write_report
from harness.gates.paired import paired_gate, write_paired_report
from harness.history.backfill import backfill_records
from harness.history.commits import at_head_if_unknown, commit_of, commit_that_added, head_commit, show_file
from harness.history.machines import NOT_RECORDED, cpu_kind, gpu_kind, machine_from_kind_text
from harness.history.sources import records_from_run
from harness.history.sources.gpu_names import LAYER_ROWS, PATH_BLOCKS, RECORDED_BLOCKS
from harness.paths import REPO_ROOT
from harness.tune.check.rule import judge_point, judge_stale, tolerance

REPORTS = REPO_ROOT / "reports"
H100_TABLE = REPO_ROOT / "fixtures" / "dispatch" / "nvidia-h100-80gb-hbm3.json"
CALIBRATION_MACHINE = "x86_64, 2 CPUs, AuthenticAMD 25 1, avx2, AMX not usable, kernel 6.18.44-fc-v1252"
HEAD = commit_of("HEAD")


def _cpuinfo(flags: str, vendor: str = "AuthenticAMD", family: int = 25, model: int = 17) -> str:
    return (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"model name\t: Some CPU\nflags\t\t: {flags}\n")


def _by_metric(record) -> dict:
    return {f.metric: f for f in record.figures}


# --- machines and commits -------------------------------------------------------------------------------------

def test_cpu_kind_names_vendor_family_model_and_the_widest_extension():
    assert cpu_kind(_cpuinfo("fpu avx avx2 avx512f"), {}) == "cpu: AuthenticAMD family 25 model 17, avx512"
    assert cpu_kind(_cpuinfo("avx2"), {}) == "cpu: AuthenticAMD family 25 model 17, avx2"
    intel = _cpuinfo("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "GenuineIntel", 6, 143)
    assert cpu_kind(intel, {}) == "cpu: GenuineIntel family 6 model 143, amx"
    emulated = cpu_kind(intel, {"QWEN36_EMULATE_CPU": "avx2"})
    assert emulated == "cpu: GenuineIntel family 6 model 143, amx (emulated avx2)"
    assert gpu_kind("NVIDIA H200") == "gpu: NVIDIA H200"


def test_a_machine_kind_line_maps_to_the_cpu_kind_and_keeps_the_line_as_detail():
    m = machine_from_kind_text(CALIBRATION_MACHINE + "\n")
    assert m.kind == "cpu: AuthenticAMD family 25 model 1, avx2" and m.detail == CALIBRATION_MACHINE
    amx = machine_from_kind_text("x86_64, 2 CPUs, GenuineIntel 6 167, avx2 avx512f amx_tile amx_bf16, AMX usable, "
                                 "kernel 6.18.44-fc-v1147")
    assert amx.kind == "cpu: GenuineIntel family 6 model 167, amx"
    assert machine_from_kind_text("x86_64, 2 CPUs (this workplace's CI machine kind)").kind == NOT_RECORDED


def test_commits_from_git_and_none_where_git_does_not_know():
    sha, dirty = head_commit(REPO_ROOT)
    assert sha == HEAD and re.fullmatch(r"[0-9a-f]{40}", sha) and isinstance(dirty, bool)
    assert re.fullmatch(r"[0-9a-f]{40}", commit_that_added("reports/decode-step-h200-2026-12-05/step/step.json"))
    assert commit_that_added("reports/no-such-file.json") is None
    assert commit_of("no-such-branch-or-commit") is None
    assert head_commit(Path("/")) == (None, False)  # not a repository


# --- qwen36 tune --check ----------------------------------------------------------------------------------------

def _check_payload(verdicts: list, **more) -> dict:
    """check.json as harness/tune/check/run.py _write_report writes it."""
    return {"command": "python -m harness.tune --check --no-progress", "device": "NVIDIA H200",
            "table": "fixtures/dispatch/nvidia-h200.json", "kind": "routine check",
            "machine": {"device": "NVIDIA H200", "gpu_uuid": "4f40d372-60c0"}, "date": "2026-12-05",
            "torch": "2.11.0+cu130", "injected": [], "passed": True, "seconds": 12.0, "sweeps": 3, "failures": [],
            "notes": [], "verdicts": [v.as_dict() for v in verdicts], "measured": [], **more}


def test_tune_check_gives_one_figure_per_point_verdict(tmp_path):
    graph = judge_point("moe_experts", 8, "triton_decode", "graph", [14.6, 14.7, 14.9], [15.0, 14.8, 15.2])
    eager = judge_point("moe_experts", 8, "triton_decode", "eager", [70.0, 75.0], [74.0, 80.0, 76.0], gated=False)
    decode = judge_point("gdn_decode", 1, "fla_recurrent", "graph", [10.0, 10.5], [10.2, 10.1, 10.4])
    stale = judge_stale("gdn_decode", 1, "graph", "fla_recurrent", {"fla_recurrent": [10.0], "chunked": [200.0]}, 0.1)
    (tmp_path / "check.json").write_text(json.dumps(_check_payload([graph, eager, decode, stale])))

    (record,) = records_from_run(tmp_path, commit="HEAD")
    figures = _by_metric(record)
    assert set(figures) == {"gpu.moe_experts.triton_decode.t8.graph_us", "gpu.moe_experts.triton_decode.t8.eager_us",
                            "gpu.gdn_decode.fla_recurrent.b1.graph_us"}  # the stale verdict measures nothing new
    f = figures["gpu.moe_experts.triton_decode.t8.graph_us"]
    assert (f.value, f.low, f.high, f.spread) == (15.0, 14.8, 15.2, "min..max of 3 sweeps")
    assert (f.unit, f.direction, f.gated) == ("us", "lower", True)
    assert f.threshold == pytest.approx(graph.tolerance)
    assert figures["gpu.moe_experts.triton_decode.t8.eager_us"].gated is False
    assert record.kind == "tune-check" and record.date == "2026-12-05" and record.commit == HEAD
    assert record.machine.kind == "gpu: NVIDIA H200" and "4f40d372-60c0" in record.machine.detail
    assert record.source == str(tmp_path / "check.json")  # outside the repository: as given


# --- qwen36 tune and the dispatch table ----------------------------------------------------------------------------

def test_a_dispatch_table_gives_one_record_per_recorded_run(tmp_path):
    raw = json.loads(H100_TABLE.read_text())
    keep = {("gdn_decode", 1), ("moe_block", 1), ("decode_step", 1)}
    raw["timings"]["points"] = [p for p in raw["timings"]["points"] if (p["block"], p["key"]) in keep]
    (tmp_path / "nvidia-h100-80gb-hbm3.json").write_text(json.dumps(raw))

    records = records_from_run(tmp_path / "nvidia-h100-80gb-hbm3.json")
    assert [r.kind for r in records] == ["dispatch-table"] * 3  # runs 0 (qwen36 tune), 1 and 2 (--check --add-run)
    assert {r.machine.kind for r in records} == {"gpu: NVIDIA H100 80GB HBM3"}
    # Two machines of one kind: the GPUs' UUIDs, in the detail, tell them apart.
    assert len({r.machine.detail.split(",")[0] for r in records}) == 2
    first, second = (_by_metric(r) for r in records[:2])
    point = next(p for p in raw["timings"]["points"]
                 if (p["block"], p["key"], p["path"]) == ("gdn_decode", 1, "fla_recurrent"))
    run0 = point["runs"][0]["graph_us"]
    f = first["gpu.gdn_decode.fla_recurrent.b1.graph_us"]
    assert (f.value, f.low, f.high) == (statistics.median(run0), min(run0), max(run0))
    every = [v for e in point["runs"] for v in e["graph_us"]]
    assert f.threshold == pytest.approx(tolerance(every, "graph"))  # what a check against this table allows
    # Gated: the table's path at its dispatch points, the block as served, the step, in the mode it ranks by.
    assert f.gated and not first["gpu.gdn_decode.fla_recurrent.b1.eager_us"].gated
    assert not first["gpu.gdn_decode.chunked.b1.graph_us"].gated
    assert first["gpu.moe_block.triton_fused_block.t1.graph_us"].gated
    assert not first["gpu.moe_block.tiny_bmm.t1.graph_us"].gated
    assert first["gpu.decode_step.served.b1.graph_us"].gated
    assert "gpu.gdn_decode.chunked.b1.graph_us" not in second  # a check adds the points it times only


def test_tune_json_keeps_the_rows_a_table_records(tmp_path):
    raw = json.loads((REPORTS / "decode-step-h200-2026-12-05/tune/tune.json").read_text())
    raw["rows"] = [r for r in raw["rows"] if r["block"] in ("gdn_layer_decode", "moe_router", "gdn_decode")
                   and r["key"] <= 8]
    (tmp_path / "tune.json").write_text(json.dumps(raw))

    (record,) = records_from_run(tmp_path)
    figures = _by_metric(record)
    assert record.kind == "tune-table" and record.machine.kind == "gpu: NVIDIA H200"
    layer = {m for m in figures if m.startswith("gpu.gdn_layer_decode.")}
    batches = {r["key"] for r in raw["rows"] if r["block"] == "gdn_layer_decode"}
    assert len(batches) == 1 and any(r["path"] == "in_proj" for r in raw["rows"])
    assert layer == {f"gpu.gdn_layer_decode.{p}.b{b}.{mode}_us" for p in ("layer", "triton") for b in batches
                     for mode in ("eager", "graph")}  # the stages (in_proj, conv, ...) are reported, not recorded
    assert not any(m.startswith("gpu.moe_router.") for m in figures)
    row = next(r for r in raw["rows"] if (r["block"], r["key"], r["path"]) == ("gdn_decode", 1, "fla_recurrent"))
    f = figures["gpu.gdn_decode.fla_recurrent.b1.graph_us"]
    assert f.value == statistics.median(row["graph_sweeps_us"]) and f.gated


def test_a_config_sweep_has_nothing_to_plot(tmp_path):
    raw = json.loads((REPORTS / "gpu-gate-h100-2026-12-06/sweep/tune.json").read_text())
    raw["rows"] = raw["rows"][:3]
    (tmp_path / "tune.json").write_text(json.dumps(raw))
    with pytest.raises(HarnessError, match="config sweep"):
        records_from_run(tmp_path)


# --- qwen36 tune step ---------------------------------------------------------------------------------------------

def test_tune_step_gives_the_step_its_replay_and_its_kernel_count(tmp_path):
    raw = json.loads((REPORTS / "decode-step-h200-2026-12-05/step/step.json").read_text())
    raw["rows"] = raw["rows"][:2]
    (tmp_path / "step.json").write_text(json.dumps(raw))

    (record,) = records_from_run(tmp_path / "step.json", commit=HEAD)
    figures = _by_metric(record)
    row = raw["rows"][0]
    eager = figures["gpu.decode_step.b1.eager_us"]
    step = row["step"]
    assert (eager.value, eager.low, eager.high) == (step["median_us"], step["p25_us"], step["p75_us"])
    assert eager.spread == "IQR of 20 steps" and not eager.gated
    assert figures["gpu.decode_step.b1.graph_replay_us"].value == row["graph"]["replay"]["median_us"]
    kernels = figures["gpu.decode_step.b8.kernels"]
    assert (kernels.value, kernels.unit, kernels.threshold) == (873, "kernels", None)
    assert record.kind == "tune-step" and record.machine.kind == "gpu: NVIDIA H200" and record.commit == HEAD


# --- CI's paired gates, qwen36 ab --------------------------------------------------------------------------------

POINTS = {"decode-micro@c2": 2, "official-like@c1": 1}


def _arm(folder: Path, base_url: str, values: dict[str, list[float]], commit: str) -> None:
    """One arm's run directory as harness/bench/run.py write_outputs writes it: one repeat per round."""
    folder.mkdir(parents=True)
    manifest = {"harness": {"version": "0", "commit": commit, "dirty": False},
                "server": {"base_url": base_url, "command": "vllm serve", "version": "0.32.0"},
                "model": "tiny", "datasets": [], "seeds": {"dataset": 0}, "host": {}, "created": "2026-12-07T10:00:00",
                "points": [{"name": p, "concurrency": c, "repeats": 3, "dataset": p.split("@")[0]}
                           for p, c in POINTS.items()], "end_reason": "completed", "machine_speed": None}
    points = {}
    for point, c in POINTS.items():
        repeats = [RunSummary({"output_tps_p10": tps, "ttft_p90": 0.05 * tps / 100, "success_rate": 1.0,
                               "cache_hit_rate": 0.9 if point.startswith("official") else 0.0,
                               "weighted_throughput": 30 * tps, "requests": 8, "successes": 8},
                              {}, [], 0, 0, 0, repeat=i).to_json() for i, tps in enumerate(values[point])]
        points[point] = {"concurrency": c, "repeats": repeats, "table": None, "interrupted": False}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "summary.json").write_text(json.dumps({"end_reason": "completed", "points": points}))


def _interleaved(root: Path, arms: dict[str, dict[str, list[float]]]) -> Path:
    """A run as harness/gates/interleave.py leaves it: rounds.json and one run directory per arm."""
    for i, (label, values) in enumerate(arms.items()):
        _arm(root / label, f"http://127.0.0.1:{8000 + i}", values, HEAD)
    (root / "rounds.json").write_text(json.dumps({
        "arms": {label: f"http://127.0.0.1:{8000 + i}" for i, label in enumerate(arms)}, "rounds": 3,
        "end_reason": "completed", "quiet_s": 1.2, "points": list(POINTS), "blocks": []}))
    return root


def test_ci_paired_gate_records_the_twin_the_commit_under_test(tmp_path):
    twin = {"decode-micro@c2": [100.0, 110.0, 121.0], "official-like@c1": [200.0, 210.0, 190.0]}
    run = _interleaved(tmp_path / "20261207-100000-ci", {
        "session": {p: [v * 1.01 for v in vs] for p, vs in twin.items()}, "twin": twin,
        "twin-slowed": {p: [v * 0.7 for v in vs] for p, vs in twin.items()}})
    (tmp_path / "machine.txt").write_text(CALIBRATION_MACHINE + "\n")  # calibrate.MACHINE_FILE, beside the runs
    report = paired_gate(run, "session", "twin")  # the writer's reader accepts the run: its format is the real one
    (run / "gate-aa-control").mkdir()
    write_paired_report(report, run / "gate-aa-control")

    (record,) = records_from_run(run / "gate-aa-control")
    figures = _by_metric(record)
    tps = figures["cpu_gate.decode-micro.c2.output_tps_p10"]
    assert tps.value == pytest.approx(110.0)  # the geometric mean of 100, 110, 121
    assert (tps.low, tps.high, tps.unit, tps.direction) == (100.0, 121.0, "tok/s", "higher")
    assert tps.threshold == 0.095 and tps.gated and "3 interleaved blocks" in tps.spread  # fixtures/gates/paired.yaml
    assert figures["cpu_gate.official-like.c1.ttft_p90"].direction == "lower"
    assert figures["cpu_gate.official-like.c1.success_rate"].threshold is None  # an absolute tolerance
    assert set(figures) == {f"cpu_gate.{p.replace('@', '.')}.{m}" for p, ms in
                            (("decode-micro@c2", ("output_tps_p10", "weighted_throughput", "success_rate")),
                             ("official-like@c1", ("ttft_p90", "weighted_throughput", "cache_hit_rate",
                                                   "success_rate"))) for m in ms}
    assert record.kind == "paired-gate" and record.commit == HEAD and "manifest" in record.commit_source
    assert record.machine.kind == "cpu: AuthenticAMD family 25 model 1, avx2"
    assert record.source == str(run / "twin") and any("aa-control: twin against session: pass" in n
                                                      for n in record.notes)
    session = _by_metric(records_from_run(run, side="session")[0])
    assert session["cpu_gate.decode-micro.c2.output_tps_p10"].value == pytest.approx(111.1)


def test_qwen36_ab_records_b_and_the_reference_side_has_no_commit(tmp_path):
    values = {"decode-micro@c2": [100.0, 100.0], "official-like@c1": [50.0, 60.0]}
    run = _interleaved(tmp_path / "20261207-100000-ab", {"A": values, "B": values})
    (record,) = records_from_run(run, machine="cpu: laptop")
    assert record.kind == "ab" and record.command == "qwen36 ab" and record.source == str(run / "B")
    assert record.machine.kind == "cpu: laptop"
    (reference,) = records_from_run(run / "A")  # an arm's folder names the side
    assert reference.commit is None and "reference" in reference.commit_source


def test_cis_reference_arm_is_the_commit_reference_yaml_named_and_is_never_filed_under_head(tmp_path):
    values = {"decode-micro@c2": [100.0, 100.0], "official-like@c1": [50.0, 60.0]}
    run = _interleaved(tmp_path / "20261207-100000-ci", {"session": values, "twin": values, "reference": values})
    (reference,) = records_from_run(run, side="reference")
    named = yaml.safe_load(show_file(HEAD, "fixtures/gates/reference.yaml"))["commit"]
    assert reference.commit == named and "reference.yaml" in reference.commit_source
    (a_side,) = records_from_run(_interleaved(tmp_path / "ab", {"A": values, "B": values}) / "A")
    assert a_side.commit is None and at_head_if_unknown(a_side, "a test") is a_side  # not HEAD's, and unknown


# --- qwen36 bench, the live gate, a recorded profile --------------------------------------------------------------

def test_a_remote_bench_run_with_the_live_gate_report_is_gated_by_it(tmp_path):
    run = tmp_path / "20261207-100000-gate-bi-v100-tp4-245k"
    _arm(run, "http://10.0.0.5:8000", {"decode-micro@c2": [9.0, 8.0], "official-like@c1": [6.0, 6.2, 5.9]}, HEAD)
    spec_tol = Tolerance(0.1)
    decision = decide([12.7], [0.0305, 0.031, 0.0295], "lower", spec_tol)
    write_report(GateReport("bi-v100-tp4-245k", [str(run)], [GateRow("official-like@c1", "ttft_p90", "s", "lower",
                                                                       spec_tol, decision, "<= 10", True)]), run)

    (record,) = records_from_run(run)
    figures = _by_metric(record)
    assert record.kind == "live-gate" and "--baseline-profile bi-v100-tp4-245k" in record.command
    assert record.machine.kind == "server: 4 x Iluvatar BI-V100 32GB, vLLM (CoreX), tensor-parallel 4"
    ttft = figures["bench.official-like.c1.ttft_p90"]
    assert (ttft.gated, ttft.threshold, ttft.unit) == (True, 0.1, "s")
    tps = figures["bench.official-like.c1.output_tps_p10"]
    assert (tps.value, tps.low, tps.high, tps.gated) == (6.0, 5.9, 6.2, False)  # the median of the repeats
    hit = figures["bench.decode-micro.c2.cache_hit_rate"]
    assert (hit.value, hit.unit, hit.direction) == (0.0, "ratio", "higher")
    assert record.commit == HEAD and any("client's checkout" in n for n in record.notes)
    assert records_from_run(run / "gate.json") == [record]  # the gate's report names its run directory


def test_an_embedded_bench_run_is_on_the_cpu_its_speed_probe_named(tmp_path):
    run = tmp_path / "20261207-100000-quick"
    _arm(run, "http://127.0.0.1:8123", {"decode-micro@c2": [90.0], "official-like@c1": [80.0]}, HEAD)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["machine_speed"] = {"probe": "eager-torch-decode-v1", "machine": CALIBRATION_MACHINE}
    manifest["harness"]["dirty"] = True
    (run / "manifest.json").write_text(json.dumps(manifest))

    (record,) = records_from_run(run / "summary.json")
    assert record.kind == "bench" and record.machine.kind == "cpu: AuthenticAMD family 25 model 1, avx2"
    f = _by_metric(record)["bench.decode-micro.c2.output_tps_p10"]
    assert (f.value, f.low, f.spread, f.gated) == (90.0, None, "", False)
    assert any("uncommitted" in n for n in record.notes)


def test_a_recorded_profile_is_a_record_of_the_commit_it_recorded():
    (record,) = records_from_run(REPO_ROOT / "fixtures/baselines/cpu-tiny.yaml")
    raw_repeats = [285.4668931274758, 284.9887312855975, 281.59901155449177, 284.8415238574681, 285.8881867731267]
    f = _by_metric(record)["bench.decode-micro.c2.output_tps_p10"]
    assert f.value == pytest.approx(math.exp(statistics.fmean(map(math.log, raw_repeats))))
    assert (f.threshold, f.low, f.high) == (0.2, min(raw_repeats), max(raw_repeats))
    assert record.kind == "baseline" and record.commit == "a1c1800a55453551f1e9afaa389232e19a092b8f"
    assert record.machine.kind == "cpu: GenuineIntel family 6 model 167, amx"


# --- what is not a run, and the backfill ------------------------------------------------------------------------

def test_a_directory_of_no_known_run_says_what_was_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing")
    with pytest.raises(HarnessError) as exc:
        records_from_run(tmp_path)
    message = str(exc.value)
    assert str(tmp_path) in message
    for looked_for in ("check.json", "tune.json", "step.json", "rounds.json", "manifest.json and summary.json",
                       "qwen36 tune --check", "qwen36 bench", "qwen36 ab"):
        assert looked_for in message


def test_backfill_finds_both_gpus_and_a_cpu_each_record_from_a_file_that_exists():
    records, skipped = backfill_records(REPO_ROOT)
    kinds = {r.machine.kind for r in records}
    assert {"gpu: NVIDIA H100 80GB HBM3", "gpu: NVIDIA H200"} <= kinds
    assert any(k.startswith("cpu: ") and k != NOT_RECORDED for k in kinds)
    assert all((REPO_ROOT / r.source).is_file() for r in records)
    assert all(r.commit_source for r in records)
    assert len({r.identity for r in records}) == len(records)
    tables = [r for r in records if r.kind == "dispatch-table"]
    assert {r.commit for r in tables} >= {commit_that_added("fixtures/dispatch/nvidia-h100-80gb-hbm3.json")}
    why = dict(skipped)
    assert "pair differences" in why["reports/calibration-2026-12-03/results.jsonl"]
    assert "--inject-delay" in why["reports/gpu-gate-2026-12-04/m2-38ca269f-injA.json"]
    # A check added to the table (--add-run) is one run: kept once, as the table's.
    added = next(k for k in why if k.startswith("reports/gpu-gate-2026-12-04/m2-38ca269f-add.json"))
    assert "the same run" in why[added] and "dispatch-table" in why[added]


def test_the_readers_import_no_torch():
    code = ("import sys; from pathlib import Path; from harness.history.sources import records_from_run; "
            "from harness.history.backfill import backfill_records; "
            "records_from_run(Path('reports/decode-step-h200-2026-12-05/check/check.json')); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)


def _tuple_assigned(path: Path, name: str) -> tuple:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not assigned in {path}")


def test_the_tuners_constants_copied_without_torch_match_their_sources():
    assert RECORDED_BLOCKS == _tuple_assigned(REPO_ROOT / "harness/tune/table/record.py", "RECORDED_BLOCKS")
    assert PATH_BLOCKS == _tuple_assigned(REPO_ROOT / "harness/tune/check/plan.py", "PATH_BLOCKS")
    layer_table = (REPO_ROOT / "model/gdn/decode_layer.py").read_text().split("GDN_DECODE_LAYER_PATHS = ", 1)[1]
    paths = re.findall(r'ComputePath\("(\w+)"', layer_table.split("])", 1)[0])
    assert set(LAYER_ROWS) == {"layer"} | (set(paths) - {"reference", "staged"})
