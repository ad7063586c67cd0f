"""`qwen36 tune moe --sweep-configs`: the candidates per token count, the choice among them (a wrong output is
never chosen), the table to paste, the refusal on a CPU, and the sweep end to end (through Triton's
interpreter on a CPU; compiled on a GPU)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.tune.configs import sweep as config_sweep
from harness.tune.configs.choice import choose, config_expr, pasteable_table, summary_lines
from harness.tune.measure import dims as D
from harness.tune.measure.ceilings import ceilings_for
from harness.tune.measure.floors import Floor
from harness.tune.measure.point import Measurement, Settings
from harness.tune.measure.prune import Pruner
from harness.tune.measure.timing import L2Flusher, Timing
from model.moe import EXPERT_PATHS

triton_decode = pytest.importorskip("model.moe.triton_decode", reason="triton is not installed")
triton_grouped = pytest.importorskip("model.moe.triton_grouped", reason="triton is not installed")
config_space = pytest.importorskip("harness.tune.configs.space", reason="triton is not installed")

DecodeConfig, GroupedConfig = triton_decode.DecodeConfig, triton_grouped.GroupedConfig
CONFIG_TYPES = {"DecodeConfig": DecodeConfig, "GroupedConfig": GroupedConfig}
REPO = Path(__file__).resolve().parents[2]
compiled = pytest.mark.skipif(triton_decode.INTERPRETED, reason="TRITON_INTERPRET=1 is set for this process")


def timing(us):
    return None if us is None else Timing(us, us * 0.95, us * 1.05, 20)


def row(key, config, eager_us, graph_us=None, status="ok", registered=False, block="triton_decode_configs"):
    return Measurement(block, key, config_expr(config), status, eager=timing(eager_us), graph=timing(graph_us),
                       floor=Floor(1.0, None), extra={"registered": registered})


def load_table(text: str, name: str) -> tuple:
    namespace = dict(CONFIG_TYPES)
    exec(text, namespace)
    return namespace[name]


def served(table: tuple, tokens: int):
    """How the kernel modules read their table: the first entry whose largest T covers `tokens`."""
    return next(config for largest, config in table if tokens <= largest)


# --- candidates -----------------------------------------------------------------------------------------

@compiled
@pytest.mark.parametrize("kernel", config_space.TRITON_KERNELS, ids=lambda k: k.path)
def test_the_registered_config_and_the_whole_registered_table_are_candidates_at_every_point(kernel):
    path = EXPERT_PATHS[kernel.path]
    for tokens in (t for t in D.MOE_TOKENS if path.takes_tokens(t)):
        candidates = kernel.candidates(tokens)
        assert candidates[0] == served(kernel.entries, tokens), tokens
        assert {c for _, c in kernel.entries} <= set(candidates)
        assert len(candidates) == len(set(candidates)) > len(kernel.entries), "each config once, and more than today's"
        assert all(type(c) is kernel.config_type for c in candidates)


@compiled
def test_grouped_candidates_change_with_the_rows_per_expert():
    kernel = config_space.triton_kernel("triton_grouped")
    small, large = set(kernel.candidates(1)), set(kernel.candidates(8192))
    small, large = small - {c for _, c in kernel.entries}, large - {c for _, c in kernel.entries}
    assert small and large and small != large
    mean_block_m = {name: sum(c.block_m for c in s) / len(s) for name, s in (("small", small), ("large", large))}
    assert mean_block_m["large"] > mean_block_m["small"], "many rows per expert: larger row blocks are tried"


@pytest.mark.parametrize("config", [
    DecodeConfig(), DecodeConfig(block_i=2, block_n=16), GroupedConfig(block_m=128, gate_up_warps=8),
    *(c for _, c in triton_decode.DECODE_CONFIGS), *(c for _, c in triton_grouped.GROUPED_CONFIGS),
], ids=str)
def test_a_config_is_named_by_an_expression_that_builds_it_again(config):
    expr = config_expr(config)
    assert eval(expr, dict(CONFIG_TYPES)) == config
    defaults = type(config)()
    for f in dataclasses.fields(config):
        assert (f"{f.name}=" in expr) == (getattr(config, f.name) != getattr(defaults, f.name)), f.name


# --- the choice -----------------------------------------------------------------------------------------

A, B, C, E = DecodeConfig(), DecodeConfig(block_i=2), DecodeConfig(block_i=4), DecodeConfig(block_n=4)


def test_the_fastest_correct_config_wins_by_graph_replay_or_by_eager_time_and_a_wrong_one_never():
    rows = [row(1, A, 24, 20, registered=True), row(1, B, 5, 4, status="wrong"), row(1, C, 25, 15),
            row(1, E, None, status="error")]
    by_graph, by_eager = choose(rows, "triton_decode_configs", True)[1], choose(rows, "triton_decode_configs", False)[1]
    assert by_graph.winner["path"] == config_expr(C) and by_graph.winner["mode"] == "graph"
    assert by_eager.winner["path"] == config_expr(A) and by_eager.winner["mode"] == "eager"
    assert by_graph.registered == config_expr(A) and by_graph.registered_time["us"] == 20
    assert by_graph.speedup == pytest.approx(20 / 15) and by_eager.speedup == pytest.approx(1.0)
    assert by_graph.counts == {"ok": 2, "wrong": 1, "error": 1}


def test_the_table_takes_a_winner_only_where_it_is_clearly_faster_than_the_registered_config():
    # timing(): quartiles at 0.95 and 1.05 of the median. B's 19 us: upper quartile 19.95 over A's lower 19.
    close = choose([row(1, A, 20, registered=True), row(1, B, 19)], "triton_decode_configs", False)[1]
    assert close.winner["path"] == config_expr(B) and close.chosen == config_expr(A)
    clear = choose([row(1, A, 20, registered=True), row(1, B, 17)], "triton_decode_configs", False)[1]
    assert clear.winner["path"] == config_expr(B) and clear.chosen == config_expr(B)
    assert "within the spread" in "\n".join(summary_lines({1: close}))
    # Without a correct registered config there is nothing to keep: the winner serves.
    lost = choose([row(1, A, 20, status="wrong", registered=True), row(1, B, 19.9)], "triton_decode_configs", False)[1]
    assert lost.chosen == config_expr(B)


def test_a_point_where_only_wrong_configs_ran_has_no_winner_and_says_why_the_registered_one_lost():
    rows = [row(8, A, 10, status="wrong", registered=True), row(8, B, 5, status="wrong")]
    rows[0].detail = "relative error 1e-1 > bound 1.5e-2"
    choice = choose(rows, "triton_decode_configs", True)[8]
    assert choice.winner is None and choice.registered_time is None and choice.speedup is None
    assert choice.registered_status.startswith("wrong: relative error")


def test_the_pasted_table_serves_each_point_its_winner_and_the_span_up_to_the_next_point():
    long = GroupedConfig(block_m=128, gate_up_n=256, gate_up_k=128, gate_up_warps=8, gate_up_stages=5, down_n=256,
                         down_k=128, down_warps=8, down_stages=5, sum_n=512)
    small, mid = GroupedConfig(block_m=16), GroupedConfig(block_m=32, gate_up_k=128)
    winners = {1: small, 2: small, 4: mid, 64: mid, 512: long, 4096: small}
    text = pasteable_table("GROUPED_CONFIGS", "GroupedConfig", {t: config_expr(c) for t, c in winners.items()})
    table = load_table(text, "GROUPED_CONFIGS")
    points = sorted(winners)
    for tokens in range(1, 9000):
        nearest_below = max((p for p in points if p <= tokens), default=points[0])
        assert served(table, tokens) == winners[nearest_below], tokens
    assert len(table) == 4, "neighbouring points with one winner share an entry"
    assert table[-1][0] >= 2**30, "the last entry serves every larger T"
    assert max(map(len, text.splitlines())) <= 120, text


# --- the sweep through tune's measurement, with stand-in kernels on a CPU -------------------------------

@dataclass(frozen=True)
class StandInConfig:
    delay_ms: float = 0.0
    wrong: bool = False


def stand_in_run(x, w13, w2, weights, ids, out, config):
    """The `sorted` path, slowed down by the config's delay, its output spoilt where the config is `wrong`."""
    EXPERT_PATHS["sorted"].fn(x, w13, w2, weights, ids, out)
    time.sleep(config.delay_ms / 1e3)
    return out.add_(1.0) if config.wrong else out


REGISTERED, QUICKER, WRONG_AND_QUICKEST = StandInConfig(4.0), StandInConfig(1.0), StandInConfig(0.0, wrong=True)
STAND_IN = config_space.TritonKernel(
    "sorted", "model/moe/stand_in.py", "STAND_IN_CONFIGS", StandInConfig, ((1 << 30, REGISTERED),), stand_in_run,
    lambda tokens: REGISTERED, lambda tokens: [WRONG_AND_QUICKEST, QUICKER], interpreted=False)


@pytest.fixture()
def stand_in_sweep(monkeypatch):
    monkeypatch.setattr(config_sweep, "_kernels", lambda: (STAND_IN,))
    cpu = torch.device("cpu")
    s = Settings(cpu, torch.float32, reps=3, warmup=0, graphs=False, flusher=L2Flusher(cpu))
    rows, notes, ticks = [], [], []
    pruners = {"sorted": Pruner(8.0, prefer_graph=False)}
    config_sweep.sweep_configs(D.TINY.moe, (1, 4), s, ceilings_for("cpu"), pruners, ticks.append, rows, notes, 4)
    steps = config_sweep.config_sweep_steps((1, 4), s, 4)
    return rows, notes, ticks, steps, config_sweep.config_sweep_section(rows, False, "eager")


def test_the_sweep_checks_every_candidate_and_never_chooses_a_wrong_one(stand_in_sweep):
    rows, notes, ticks, steps, section = stand_in_sweep
    assert notes == [], "nothing to precompile on a CPU"
    assert len(ticks) == steps == 2 * 3, "one progress step per candidate and point"
    assert sorted((r.key, r.path) for r in rows) == sorted(
        (t, config_expr(c)) for t in (1, 4) for c in (REGISTERED, QUICKER, WRONG_AND_QUICKEST))
    wrong = config_expr(WRONG_AND_QUICKEST)
    assert {r.status for r in rows if r.path == wrong} == {"wrong"}
    assert all(r.status == "ok" and r.err_eager <= r.bound for r in rows if r.path != wrong)
    assert [r.extra["registered"] for r in rows if r.key == 1] == [True, False, False]
    points = section.data["sorted"]["points"]
    for tokens in (1, 4):
        correct = [r for r in rows if r.key == tokens and r.status == "ok"]
        assert points[tokens]["winner"]["path"] == min(correct, key=lambda r: r.eager.median_us).path
        assert points[tokens]["registered"] == config_expr(REGISTERED)
    namespace = {"StandInConfig": StandInConfig}
    exec(section.data["sorted"]["python"], namespace)
    assert WRONG_AND_QUICKEST not in [c for _, c in namespace["STAND_IN_CONFIGS"]]
    assert sum(line.startswith("- WRONG at T=") for line in section.lines) == 2, "each wrong output is reported"


# --- the command ----------------------------------------------------------------------------------------

@compiled
@pytest.mark.parametrize("target", ["moe", "all"])
def test_on_a_cpu_the_sweep_refuses_with_why_and_what_to_run(target, tmp_path, capsys):
    code = main(["tune", target, "--sweep-configs", "--device", "cpu", "--dims", "tiny", "--no-progress",
                 "--report-dir", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "qwen36 tune moe --sweep-configs" in err
    if target == "moe":
        assert "Triton compiles for CUDA" in err and "TRITON_INTERPRET=1" in err and "--dims tiny" in err
    assert not (tmp_path / "report").exists(), "a refused run writes nothing"


def raising_at_4_tokens(exc: BaseException):
    """The stand-in kernel, which raises `exc` at T=4 (Ctrl-C, or a launch that fails there)."""
    def run(x, w13, w2, weights, ids, out, config):
        if x.shape[0] == 4:
            raise exc
        return stand_in_run(x, w13, w2, weights, ids, out, config)

    return run


def stand_in_sweep_command(monkeypatch, run, tokens: str, report_dir: Path) -> int:
    """`qwen36 tune moe --sweep-configs` on a CPU with the stand-in kernel running as `run`."""
    monkeypatch.setattr(config_sweep, "_kernels", lambda: (dataclasses.replace(STAND_IN, run=run),))
    monkeypatch.setattr(config_sweep, "why_no_config_sweep", lambda *args: None)
    return main(["tune", "moe", "--sweep-configs", "--device", "cpu", "--dims", "tiny", "--moe-tokens", tokens,
                 "--reps", "1", "--warmup", "0", "--no-progress", "--report-dir", str(report_dir)])


def test_ctrl_c_keeps_what_the_sweep_measured_in_the_report_and_writes_no_table(tmp_path, monkeypatch, capsys):
    # KeyboardInterrupt is what Ctrl-C raises in the middle of a call.
    code = stand_in_sweep_command(monkeypatch, raising_at_4_tokens(KeyboardInterrupt()), "1,4,8", tmp_path)
    assert code == 130
    report = json.loads((tmp_path / "tune.json").read_text())
    assert {r["key"] for r in report["rows"]} == {1}, "T=1 measured and kept; nothing after the interrupt"
    assert any("stopped: KeyboardInterrupt" in n for n in report["notes"]), report["notes"]
    assert list(report["config_sweep"]["sorted"]["points"]) == ["1"]
    assert report["table"] is None and not list(tmp_path.glob("cpu.json")), "a config sweep writes no dispatch table"
    assert "STAND_IN_CONFIGS" in capsys.readouterr().out, "the table to paste is printed"


def test_a_point_where_no_candidate_ran_fails_the_command_naming_it(tmp_path, monkeypatch, capsys):
    # As a tile too large for the SM fails.
    failing = raising_at_4_tokens(RuntimeError("out of resources: shared memory"))
    code = stand_in_sweep_command(monkeypatch, failing, "1,4", tmp_path)
    assert code == 1
    assert "NO CORRECT CONFIG at sorted T=4" in capsys.readouterr().err
    points = json.loads((tmp_path / "tune.json").read_text())["config_sweep"]["sorted"]["points"]
    assert points["1"]["winner"] is not None and points["4"]["winner"] is None


def sweep_command(report_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "harness.tune", "moe", "--sweep-configs", "--no-progress", "--report-dir",
            str(report_dir), *extra]


def check_report(report_dir: Path, paths: tuple[str, ...]) -> dict:
    """The report's choice restated from its rows: per path and point, the fastest correct candidate, ranked
    as the run says; the registered config measured; the table to paste serving each point its winner."""
    report = json.loads((report_dir / "tune.json").read_text())
    mode = "graph" if report["ranked_by"].startswith("graph") else "eager"
    assert set(report["config_sweep"]) == set(paths)
    for path in paths:
        result = report["config_sweep"][path]
        for key, choice in result["points"].items():
            here = [r for r in report["rows"] if r["block"] == f"{path}_configs" and r["key"] == int(key)]
            correct = [r for r in here if r["status"] == "ok" and r["err_eager"] <= r["bound"]]
            timed = lambda r: r[mode] or r["eager"]  # noqa: E731
            fastest = min(correct, key=lambda r: timed(r)["median_us"])
            assert choice["winner"]["path"] == fastest["path"], (path, key)
            registered = [r for r in here if r["registered"]]
            assert [r["path"] for r in registered] == [choice["registered"]]
            kept = registered and registered[0] in correct and timed(fastest)["p75_us"] >= timed(registered[0])["p25_us"]
            table = load_table(result["python"], result["table"])
            assert config_expr(served(table, int(key))) == (registered[0] if kept else fastest)["path"], (path, key)
    assert "```python" in (report_dir / "tune.md").read_text()
    return report


@pytest.mark.slow
def test_the_sweep_runs_end_to_end_through_the_interpreter_at_tiny_dims(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = sweep_command(tmp_path, "--device", "cpu", "--dims", "tiny", "--moe-tokens", "1", "--reps", "1",
                        "--warmup", "0")
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = check_report(tmp_path, ("triton_decode", "triton_grouped"))
    assert all(r["status"] == "ok" for r in report["rows"]), "every interpreter candidate is correct"
    assert {r["key"] for r in report["rows"]} == {1}
    assert "do not paste" in result.stdout, "interpreter times are marked as meaningless for a GPU"


@pytest.mark.gpu
@pytest.mark.slow
def test_the_sweep_on_a_gpu_at_the_real_dims(tmp_path):
    cmd = sweep_command(tmp_path, "--moe-tokens", "1,64,512", "--reps", "5", "--warmup", "1", "--compile-workers", "4")
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    report = check_report(tmp_path, ("triton_decode", "triton_grouped"))
    assert report["ranked_by"].startswith("graph")
    assert any(n.startswith("precompiled") for n in report["notes"]), report["notes"]
    assert report["table"] is None and "table_path" not in report, "configs that do not serve yet make no table"
