"""`qwen36 tune --ab REF_DIR`: the A/B rule on numbers, and end to end on a CPU at tiny dims with a head
whose `model` copy makes one dispatched path sleep, timed interleaved with this checkout's `model` as ref."""
from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.tune.ab.rule import AB_FLOORS, SideSweeps, judge_ab
from harness.tune.ab.run import HEAD_ROOT, ABOptions, _setup, run_ab
from harness.tune.check.device_table import dispatching_by
from harness.tune.check.plan import routine_plan, routine_points
from harness.tune.check.rule import FLOORS, MIN_SWEEPS
from harness.tune.table.record import recorded_points
from model.moe import EXPERT_PATHS

SLOWED = "tiny_bmm"  # the path the test table dispatches for the routed experts (and so the block serves)
SLEEP_S = 0.02


def ok(eager, graph=()):
    return SideSweeps("ok", eager_us=eager, graph_us=graph)


# --- the rule ----------------------------------------------------------------------------------------------

def test_slower_in_every_sweep_fails_naming_the_point_path_and_ratio():
    [v] = judge_ab("moe_experts", 8, "triton_decode", head=ok([130.0, 128.0, 131.0]), ref=ok([100.0, 101.0, 99.0]))
    assert v.status == "slower" and v.failed
    line = v.line()
    assert line.startswith("SLOWER: moe_experts T=8 triton_decode (eager): ref 100.0 us, head 130.0 us")
    # Either side's spread this run (head 131 / 128 - 1 = 2.3%, ref 2.0%) is under eager's floor: the floor.
    assert "x1.300" in line and "x1.267, x1.323" in line and "tolerance 3%" in line


def test_one_noisy_sweep_passes():
    [v] = judge_ab("gdn_decode", 1, "decode_step", head=ok([200.0, 101.0, 99.0]), ref=ok([100.0, 100.0, 100.0]))
    assert v.status == "pass" and not v.failed
    assert v.line().startswith("pass: gdn_decode B=1 decode_step (eager)")


def test_faster_in_every_sweep_is_reported_not_failed():
    eager, graph = judge_ab("moe_block", 1, "sorted", head=ok([50.0, 52.0, 51.0], [20.0, 20.0, 21.0]),
                            ref=ok([100.0, 100.0, 100.0], [21.0, 20.5, 21.0]))
    assert (eager.status, eager.failed) == ("faster", False)
    assert graph.status == "pass" and graph.mode == "graph" and graph.tolerance == pytest.approx(0.05)  # 21 / 20


def test_the_tolerance_is_the_points_noise_this_run_or_the_floor():
    steady = ok([1.0] * 3, [100.0, 100.2, 100.1])
    [_, graph] = judge_ab("decode_step", 1, "served", head=ok([1.0] * 3, [103.0, 103.1, 103.3]), ref=steady)
    assert graph.status == "slower" and graph.tolerance == AB_FLOORS["graph"]  # a steady 3% is caught
    noisy = ok([1.0] * 3, [100.0, 120.0, 110.0])  # 20% between sweeps on the reference side
    [_, graph] = judge_ab("add_rms_norm", 1, "triton", head=ok([1.0] * 3, [112.0, 126.0, 124.0]), ref=noisy)
    assert graph.status == "pass" and graph.tolerance == pytest.approx(0.2)


def test_head_launching_more_fails_naming_the_point():
    def counted(kernels):
        return SideSweeps("ok", "", [1.0] * 3, [1.0] * 3, "", [1.0] * 3, {"kernels": kernels, "memcpy": 0},
                          {"kernels": kernels, "memcpy": 0})

    verdicts = judge_ab("moe_block", 1, "triton_fused_block", head=counted(5), ref=counted(4))
    launch = [v for v in verdicts if "launches" in v.status]
    assert [(v.mode, v.status, v.failed) for v in launch] == [("launches", "more launches", True),
                                                              ("graph launches", "more launches", True)]
    assert launch[0].line() == "MORE LAUNCHES: moe_block T=1 triton_fused_block (launches): ref -> head: kernels 4 -> 5, memcpy 0 -> 0"
    same = judge_ab("moe_block", 1, "triton_fused_block", head=counted(4), ref=counted(4))
    assert not any(v.failed for v in same)


def test_too_few_sweeps_fail():
    [v] = judge_ab("moe_experts", 1, "p", head=ok([100.0] * (MIN_SWEEPS - 1)), ref=ok([100.0] * MIN_SWEEPS))
    assert v.status == "too-few-sweeps" and v.failed
    assert f"need {MIN_SWEEPS}" in v.line()


def test_a_wrong_output_on_one_side_fails_naming_that_side():
    [v] = judge_ab("gdn_prefill", 64, "chunked", head=ok([1.0] * 3),
                   ref=SideSweeps("wrong", "relative error 3.1e-01 > bound 1.0e-03", [None] * 3, [None] * 3))
    assert v.failed and v.side == "ref"
    assert v.line() == "WRONG on ref: gdn_prefill T=64 chunked: relative error 3.1e-01 > bound 1.0e-03"


def test_head_losing_the_graph_replay_fails_but_gaining_one_does_not():
    lost = judge_ab("moe_experts", 1, "p", head=SideSweeps("ok", "", [1.0] * 3, [None] * 3, "not capturable: X"),
                    ref=ok([1.0] * 3, [1.0] * 3))
    assert [v.status for v in lost] == ["pass", "missing"] and "not capturable: X" in lost[1].line()
    gained = judge_ab("moe_experts", 1, "p", head=ok([1.0] * 3, [1.0] * 3),
                      ref=SideSweeps("ok", "", [1.0] * 3, [None] * 3, "not capturable: Y"))
    assert [(v.status, v.failed) for v in gained] == [("pass", False), ("unpaired", False)]


# --- the command -------------------------------------------------------------------------------------------

def _range(path, at, measured_in):
    return {"from": 1, "to": None, "path": path, "measured": [{"us": 1.0, "mode": "eager", "timed_in": measured_in,
                                                               "at": at}]}


def _timing(block, key, path, **more):
    return {"block": block, "key": key, "path": path, **more,
            "runs": [{"run": 0, "eager_us": [1.0, 1.0, 1.0], "graph_us": []}]}


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    """A CPU table at tiny dims, written by hand (harness/tune/table/record.py's format): the routed experts on
    SLOWED at T=2, a decode step at B=1, the staged layer's conv at T=1 and gated norm at 4 rows, and timings
    that add the block at T=1, the layer at B=1 and the whole decode step at B=1."""
    path = tmp_path_factory.mktemp("table") / "cpu.json"
    path.write_text(json.dumps({
        "schema": "qwen36-dispatch/2", "device": "cpu", "dtype": "float32", "recorded": {"dims": "tiny"},
        "blocks": {"moe_experts": {"keyed_by": "tokens", "ranges": [_range(SLOWED, 2, "moe_experts")]},
                   "gdn_decode": {"keyed_by": "batch", "ranges": [_range("decode_step", 1, "gdn_decode")]},
                   "gdn_conv": {"keyed_by": "tokens", "ranges": [_range("update", 1, "gdn_conv")]},
                   "gdn_gated_norm": {"keyed_by": "tokens", "ranges": [_range("fused", 4, "gdn_gated_norm")]}},
        "timings": {"method": "hand-written for a test", "runs": [{"id": 0}],
                    "points": [_timing("moe_block", 1, SLOWED),
                               _timing("gdn_layer_decode", 1, "layer", rule="decode_step"),
                               _timing("decode_step", 1, "served")]}}))
    return path


def test_the_points_are_the_routine_gates_as_served(table):
    raw = json.loads(table.read_text())
    points = _setup(HEAD_ROOT, HEAD_ROOT, ABOptions(device="cpu", table=table)).points
    with dispatching_by(table):
        assert points == routine_points(routine_plan(raw, recorded_points(raw["timings"]), torch.device("cpu"),
                                                     torch.float32)), "the check's points, from the one plan"
    assert points == [{"block": "moe_experts", "key": 2, "path": SLOWED},
                      {"block": "gdn_decode", "key": 1, "path": "decode_step"},
                      {"block": "gdn_conv", "key": 1, "path": "update"},
                      {"block": "gdn_gated_norm", "key": 4, "path": "fused"},
                      {"block": "gdn_layer_decode", "key": 1, "path": "layer"},
                      # the block as this table serves it on this device: composed, with SLOWED's experts
                      {"block": "moe_block", "key": 1, "path": SLOWED},
                      {"block": "decode_step", "key": 1, "path": "served"}]


def _slowed_copy(root: Path) -> Path:
    """root/model: a copy of this checkout's, in which SLOWED's function sleeps first (a decorator line put
    above its `def`, so the path registers the slow function); root/harness: a decoy that must never load."""
    shutil.copytree(HEAD_ROOT / "model", root / "model", ignore=shutil.ignore_patterns("__pycache__"))
    fn = EXPERT_PATHS[SLOWED].fn
    source = root / Path(inspect.getsourcefile(fn)).resolve().relative_to(HEAD_ROOT)
    lines = source.read_text().splitlines(keepends=True)
    at = inspect.getsourcelines(fn)[1] - 1
    assert lines[at].startswith(f"def {fn.__name__}(")
    lines.insert(at, f"@(lambda f: lambda *a, **k: (__import__('time').sleep({SLEEP_S}), f(*a, **k))[1])\n")
    source.write_text("".join(lines))
    (root / "harness").mkdir()
    (root / "harness" / "__init__.py").write_text("raise ImportError('the decoy harness of a reference copy')\n")
    return root


@pytest.mark.timing  # compares two measured sides: run alone, where a server's start cannot stall one sweep
@pytest.mark.timeout(300)
def test_a_slowed_path_in_head_fails_naming_it(table, tmp_path, capsys):
    head = _slowed_copy(tmp_path / "head")
    out = tmp_path / "report"
    code = run_ab(head, HEAD_ROOT, ABOptions(device="cpu", table=table, sweeps=MIN_SWEEPS, reps=2, warmup=1,
                                             report_dir=out, progress=False, command="test"))
    printed = capsys.readouterr()
    report = json.loads((out / "ab.json").read_text())
    assert code == 1, printed
    slower = {(v["block"], v["key"], v["path"]) for v in report["verdicts"] if v["status"] == "slower"}
    # the whole step too: its MoE blocks serve SLOWED's experts
    assert {("moe_experts", 2, SLOWED), ("moe_block", 1, SLOWED), ("decode_step", 1, "served")} <= slower, printed.out
    [experts] = [v for v in report["verdicts"] if v["block"] == "moe_experts" and v["mode"] == "eager"]
    # The 20 ms sleep shows in full in the median; every sweep is beyond the tolerance (a sweep's ratio can lose
    # some of it to a stall of the reference's side: ci21 read one sweep under 10 beside the servers' starts).
    assert experts["ratio"] > 10 and len(experts["ratios"]) == MIN_SWEEPS
    assert all(r > 1 + FLOORS["eager"] for r in experts["ratios"]), experts["ratios"]
    assert any(line.startswith(f"SLOWER: moe_experts T=2 {SLOWED} (eager): ref ") for line in printed.out.splitlines())
    # Every point ran correctly on both sides, with the model each root holds and this checkout's harness.
    assert {v["block"] for v in report["verdicts"]} == {"moe_experts", "moe_block", "gdn_decode", "gdn_layer_decode",
                                                        "gdn_conv", "gdn_gated_norm", "decode_step"}
    assert not [v for v in report["verdicts"] if v["status"] in ("wrong", "error", "missing")]
    assert report["sides"]["head"]["model_file"] == str((head / "model" / "__init__.py").resolve())
    assert report["sides"]["ref"]["model_file"] == str(HEAD_ROOT / "model" / "__init__.py")
    assert f"head model: {(head / 'model' / '__init__.py').resolve()}" in printed.out
    assert (out / "ab.md").is_file() and "SLOWER" in (out / "ab.md").read_text()


@pytest.mark.timeout(300)
def test_a_reference_whose_model_the_harness_cannot_time_is_refused(table, tmp_path, capsys):
    """Also: nothing else fills in what the reference lacks (an editable install maps `model.*` to its own
    checkout; without the worker's guard the A/B would time that in silence)."""
    (tmp_path / "old" / "model").mkdir(parents=True)
    (tmp_path / "old" / "model" / "__init__.py").write_text('"""a model package from before model.moe"""\n')
    code = run_ab(HEAD_ROOT, tmp_path / "old", ABOptions(device="cpu", table=table, report_dir=tmp_path / "r",
                                                          progress=False))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "model.moe" in err and "too old or too new" in err


def test_the_cli_refuses_a_missing_reference_directory(tmp_path, capsys):
    assert main(["tune", "--ab", str(tmp_path / "nowhere"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "nowhere does not exist" in err and "git worktree add" in err


def test_the_cli_refuses_a_reference_without_a_model_package(tmp_path, capsys):
    assert main(["tune", "--ab", str(tmp_path), "--device", "cpu"]) == 2
    assert "has no model/__init__.py" in capsys.readouterr().err


def test_the_cli_refuses_too_few_sweeps_and_a_device_without_a_table(tmp_path, capsys):
    assert main(["tune", "--ab", str(HEAD_ROOT), "--device", "cpu", "--sweeps", str(MIN_SWEEPS - 1)]) == 2
    assert f"at least {MIN_SWEEPS}" in capsys.readouterr().err
    assert main(["tune", "--ab", str(HEAD_ROOT), "--device", "cpu", "--table", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "no dispatch table for cpu" in err and "qwen36 tune" in err
