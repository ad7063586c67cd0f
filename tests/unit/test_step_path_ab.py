"""tools/step_path_ab.py at tiny dims on a CPU, run as a person runs it: both sides time the same prefilled step
in alternating order, and each round's ratio is its own b over a."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.paths import REPO_ROOT


def test_rounds_alternate_and_each_ratio_is_b_over_a(tmp_path):
    out = tmp_path / "ab.json"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "step_path_ab.py"), "--dims", "tiny", "--device", "cpu",
         "--a", "router=reference,norm=reference", "--b", "router=topk_softmax,norm=fused",
         "--batches", "1,2", "--rounds", "3", "--reps", "2", "--prefill", "4", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert (result["a"], result["b"]) == ({"router": "reference", "norm": "reference"},
                                          {"router": "topk_softmax", "norm": "fused"})
    for batch in ("1", "2"):
        rounds = result["batches"][batch]["rounds"]
        assert [r["order"] for r in rounds] == ["ab", "ba", "ab"]
        assert all(r["ratio"] == pytest.approx(r["b"] / r["a"]) for r in rounds)
        assert result["batches"][batch]["b_faster_rounds"] == sum(r["b"] < r["a"] for r in rounds)
    assert "b faster in" in proc.stdout


def test_a_field_that_is_not_a_path_choice_is_refused_by_name():
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "step_path_ab.py"), "--b", "routre=triton_fused", "--out", "x.json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode != 0
    assert "'routre=triton_fused' is not field=value with a field of" in proc.stderr
