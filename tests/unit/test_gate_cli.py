"""`qwen36 gate` exit codes: 0 on a pass, 1 on a regression, 2 on bad input and on runs not comparable."""
from __future__ import annotations

import numpy as np
import pytest

from harness.cli import main
from harness.gates.baseline import save_baseline
from tests.unit.test_gate_runs import baseline_from, make_run, repeat, write_run

POINT = "decode@c1"


@pytest.fixture()
def setup(tmp_path):
    """A baselines root holding profile `test`, and a place for candidate run directories."""
    rng = np.random.default_rng(10)
    baselines = tmp_path / "baselines"
    save_baseline(baseline_from(make_run(tmp_path, "base", {POINT: [repeat(rng) for _ in range(5)]})), baselines)
    return rng, baselines, tmp_path


def gate_cli(baselines, *runs, profile="test"):
    return main(["gate", "--profile", profile, "--baselines-dir", str(baselines), *map(str, runs)])


def test_a_pass_exits_0_and_writes_the_report(setup, capsys):
    rng, baselines, tmp = setup
    run = write_run(tmp, "same", {POINT: [repeat(rng) for _ in range(3)]})
    assert gate_cli(baselines, run) == 0
    assert "Verdict: **PASS**" in capsys.readouterr().out and (run / "gate.json").exists()


def test_a_regression_exits_1(setup, capsys):
    rng, baselines, tmp = setup
    run = write_run(tmp, "slow", {POINT: [repeat(rng, tps=35.0) for _ in range(3)]})
    assert gate_cli(baselines, run) == 1
    assert "Verdict: **REGRESSION**" in capsys.readouterr().out


def test_a_missing_run_directory_exits_2_naming_it(setup, capsys):
    _, baselines, tmp = setup
    assert gate_cli(baselines, tmp / "nowhere") == 2
    err = capsys.readouterr().err
    assert err.startswith("qwen36 gate: error:") and "nowhere" in err and "does not exist" in err


@pytest.mark.parametrize(("summary", "message"), [
    ('{"points": {', "malformed"),
    ('[1, 2]', "expected a JSON object"),
    ('{"points": {"decode@c1": {"repeats": [1.5]}}}', "'repeats' must be a list of per-repeat summaries"),
    ('{"points": {"decode@c1": {"repeats": [{"output_tps_p10": "fast"}]}}}', "'fast' is not a number"),
])
def test_a_malformed_summary_exits_2_naming_the_file(setup, capsys, summary, message):
    rng, baselines, tmp = setup
    run = write_run(tmp, "broken", {POINT: [repeat(rng)]})
    (run / "summary.json").write_text(summary)
    assert gate_cli(baselines, run) == 2
    err = capsys.readouterr().err
    assert err.startswith("qwen36 gate: error:") and message in err


def test_an_unknown_profile_exits_2_listing_the_known_ones(setup, capsys):
    rng, baselines, tmp = setup
    run = write_run(tmp, "same", {POINT: [repeat(rng)]})
    assert gate_cli(baselines, run, profile="nope") == 2
    assert "known profiles: test" in capsys.readouterr().err


def test_runs_not_comparable_exit_2_naming_the_difference(setup, capsys):
    rng, baselines, tmp = setup
    run = write_run(tmp, "other", {POINT: [repeat(rng) for _ in range(3)]}, dataset=("decode-micro", "zzz"))
    assert gate_cli(baselines, run) == 2
    err = capsys.readouterr().err
    assert "is not comparable" in err and "datasets" in err and "--accept-difference" in err


def test_baseline_record_refuses_negative_warmups_before_measuring(tmp_path, capsys):
    # No server is given or started: the check comes before the bench.
    code = main(["baseline", "record", "--profile", "p", "--warmups", "-1", "--base-url", "http://127.0.0.1:9",
                 "--out", str(tmp_path)])
    assert code == 2 and "--warmups -1" in capsys.readouterr().err
