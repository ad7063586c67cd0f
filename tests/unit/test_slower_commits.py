"""The real slower commits kept as fixtures (harness.gates.evidence.slower_commits): each still applies to HEAD and names checks
the gate has, a replay commits it on HEAD in a scratch worktree pointed at its parent and takes it away again, and
a replay's runs are judged from their run directories (first look, confirmation) the way `qwen36 ab` judges them."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.gates.decision import Tolerance
from harness.gates.paired import PairedTolerances
from harness.gates.evidence.slower_commits import (check_applies, load_slower_commits, scratch_commit, summarise,
                                          summary_markdown, verdicts)
from harness.paths import REFERENCE_FILE, REPO_ROOT
from tests.unit.test_gate_paired import write_interleaved

COMMITS = load_slower_commits()
POINT = "decode-micro@c2"
TOL = PairedTolerances({POINT: {"output_tps_p10": Tolerance(0.1)}}, {})
BASE = [300.0, 280.0, 310.0, 290.0, 305.0, 295.0]


def blocks(factor: float, jitter=(1.0, 1.01, 0.99, 1.0, 1.02, 0.98)) -> list[dict]:
    return [{"output_tps_p10": v * factor * j} for v, j in zip(BASE, jitter)]


def test_the_three_kinds_of_slower_commit_are_kept():
    assert set(COMMITS) == {"per-request-api", "per-token-stream", "per-step-model"}


@pytest.mark.parametrize("name", sorted(COMMITS))
def test_each_fixture_applies_to_head_and_names_checks_the_gate_has(name):
    commit = COMMITS[name]
    assert check_applies(commit) is None, f"{commit.patch} no longer applies to HEAD: {check_applies(commit)}"
    gated = {(p, m) for p, metrics in PairedTolerances.load().points.items() for m in metrics}
    assert commit.own and set(commit.own) <= gated, commit.own


def test_a_patch_that_does_not_apply_says_why(tmp_path):
    bad = tmp_path / "bad.patch"
    bad.write_text("--- a/no/such/file.py\n+++ b/no/such/file.py\n@@ -1 +1 @@\n-x\n+y\n")
    problem = check_applies(type(COMMITS["per-step-model"])("bad", bad, "m", "c", ()))
    assert problem and "no/such/file.py" in problem


def test_a_scratch_commit_sits_on_head_points_its_reference_at_head_and_goes_away(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(REPO_ROOT), str(clone)], check=True, timeout=120)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    commit = COMMITS["per-step-model"]
    with scratch_commit(commit, clone) as (worktree, parent):
        assert parent == head
        log = subprocess.run(["git", "log", "-2", "--format=%H %s"], cwd=worktree, capture_output=True,
                             text=True).stdout.splitlines()
        assert log[0].endswith(commit.message) and log[1].startswith(head)
        assert (worktree / "patches/model_paths/weight_watchdog.py").exists()
        assert f"commit: {head}" in (worktree / REFERENCE_FILE.relative_to(REPO_ROOT)).read_text()
    assert not worktree.exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=clone, capture_output=True, text=True).stdout
    assert str(worktree) not in listed


def write_ab(out: Path, first_b: list[dict], second_b: list[dict] | None) -> Path:
    """What `qwen36 ab` leaves: a first look, and a confirmation round where it flagged."""
    write_interleaved(out / "20261206-100000-ab", blocks(1.0), first_b, POINT, ("A", "B"))
    if second_b is not None:
        write_interleaved(out / "20261206-100100-confirm-B-against-A", blocks(1.0), second_b, POINT, ("A", "B"))
    return out


def test_a_regression_held_by_its_confirmation_is_caught(tmp_path):
    judged = verdicts(write_ab(tmp_path, blocks(0.8), blocks(0.8)), TOL)["checks"][f"{POINT}:output_tps_p10"]
    assert judged["first"] == "regression" and judged["pooled"] == "regression" and judged["caught"]
    assert judged["worse_by"] > 0.2


def test_a_first_look_flag_the_second_round_does_not_hold_is_not_caught(tmp_path):
    judged = verdicts(write_ab(tmp_path, blocks(0.85), blocks(1.0)), TOL)["checks"][f"{POINT}:output_tps_p10"]
    assert judged["first"] == "regression" and judged["pooled"] == "pass" and not judged["caught"]


def test_a_flag_whose_point_was_not_measured_again_cannot_be_called_caught(tmp_path):
    judged = verdicts(write_ab(tmp_path, blocks(0.8), None), TOL)["checks"][f"{POINT}:output_tps_p10"]
    assert judged["first"] == "regression" and judged["pooled"] == "not measured again" and not judged["caught"]


def test_a_directory_without_an_ab_run_is_refused(tmp_path):
    with pytest.raises(HarnessError, match="no `qwen36 ab` run"):
        verdicts(tmp_path, TOL)


def test_the_summary_counts_the_runs_caught_on_the_commits_own_checks(tmp_path):
    commit = COMMITS["per-step-model"]
    write_ab(tmp_path / "run0", blocks(0.8), blocks(0.8))
    write_ab(tmp_path / "run1", blocks(1.0), None)
    (tmp_path / "replays.jsonl").write_text("".join(
        json.dumps({"commit": commit.name, "parent": "p", "run": i, "exit": code, "seconds": 300}) + "\n"
        for i, code in ((0, 1), (1, 0))))
    records = summarise(commit, tmp_path, TOL)
    assert [r["caught_on_own"] for r in records] == [True, False]
    text = (tmp_path / "summary.md").read_text()
    assert "Caught on its own checks in 1 of 2 runs" in text and "**decode-micro@c2:output_tps_p10**" in text
    assert json.loads((tmp_path / "summary.json").read_text())[0]["checks"][f"{POINT}:output_tps_p10"]["caught"]
    assert summary_markdown(commit, records) == text


def test_qwen36_slower_commit_list_names_each_fixture_and_whether_it_applies(capsys):
    from harness.cli import main

    assert main(["slower-commit", "list"]) == 0
    out = capsys.readouterr().out
    for name in COMMITS:
        assert f"{name}: " in out
    assert out.count("applies to HEAD") == len(COMMITS) and "does NOT apply" not in out


def test_replaying_an_unknown_fixture_names_the_ones_there_are(capsys):
    from harness.cli import main

    assert main(["slower-commit", "replay", "no-such-commit"]) != 0
    err = capsys.readouterr().err
    assert "no slower commit 'no-such-commit'" in err and "per-step-model" in err
