"""tools/step_path_ab.py at tiny dims on a CPU, run as a person runs it: both sides time the same prefilled step
in alternating order, each round's ratio is its own b over a, and the two sides' logits agree."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.paths import REPO_ROOT


def _run_ab(out, *args):
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "step_path_ab.py"), "--dims", "tiny", "--device", "cpu",
         "--prefill", "4", "--reps", "2", "--out", str(out), *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def test_rounds_alternate_and_each_ratio_is_b_over_a(tmp_path):
    out = tmp_path / "ab.json"
    proc = _run_ab(out, "--a", "router=reference,norm=reference", "--b", "router=topk_softmax,norm=fused",
                   "--batches", "1,2", "--rounds", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert (result["a"], result["b"]) == ({"router": "reference", "norm": "reference"},
                                          {"router": "topk_softmax", "norm": "fused"})
    assert result["cache"] == "static"  # the default: the capturable step, where the attention decode layer applies
    for batch in ("1", "2"):
        rounds = result["batches"][batch]["rounds"]
        assert [r["order"] for r in rounds] == ["ab", "ba", "ab"]
        assert all(r["ratio"] == pytest.approx(r["b"] / r["a"]) for r in rounds)
        assert result["batches"][batch]["b_faster_rounds"] == sum(r["b"] < r["a"] for r in rounds)
        assert result["batches"][batch]["b_vs_a_logits_rel_diff"] < 1e-5  # two paths, one float32 step
    assert "b faster in" in proc.stdout


def test_the_dynamic_cache_times_forward_over_the_prefill(tmp_path):
    out = tmp_path / "ab.json"
    proc = _run_ab(out, "--cache", "dynamic", "--a", "norm=reference", "--b", "norm=fused", "--batches", "1",
                   "--rounds", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["cache"] == "dynamic"
    assert [r["order"] for r in result["batches"]["1"]["rounds"]] == ["ab", "ba"]
    assert result["batches"]["1"]["b_vs_a_logits_rel_diff"] < 1e-5


def test_a_field_that_is_not_a_path_choice_is_refused_by_name():
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "step_path_ab.py"), "--b", "routre=triton_fused", "--out", "x.json"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode != 0
    assert "'routre=triton_fused' is not field=value with a field of" in proc.stderr
