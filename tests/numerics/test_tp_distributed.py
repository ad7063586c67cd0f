"""Sharded blocks over a real process group equal the unsharded blocks (issue: TP on real GPUs).

One process per rank, launched here (`tests/numerics/tp_rank_worker.py`): the MoE block, the GDN layer and
the gated attention layer, sharded with `model.tp`, all-reduced with `torch.distributed`.
- `gpu`: NCCL, world size from the GPUs present (8, 4 or 2; skipped below 2), the real model's dims.
- CPU (CI): gloo, two processes, small dims with the same structure.
With GPU_REPORT_DIR set, the rank-0 results are copied to $GPU_REPORT_DIR/tp_<backend>_<world>.json.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import tolerances

ROOT = Path(__file__).resolve().parents[2]
# NVLink multicast stays off (it can take a shared host's GPUs out of service); set even if the caller forgot.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, backend: str, dims: str, out_dir: Path, timeout_s: float) -> dict:
    """Start one worker per rank, wait for all, return rank 0's results; kill every rank on failure."""
    env = {**os.environ, **NO_MULTICAST, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": str(world), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = []
    try:
        for rank in range(world):
            cmd = [sys.executable, "-m", "tests.numerics.tp_rank_worker", "--out", str(out_dir / f"rank{rank}.json"),
                   "--backend", backend, "--dims", dims]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [(r, p.returncode, outputs[r][-3000:]) for r, p in enumerate(procs) if p.returncode != 0]
    assert not failed, f"ranks failed: {failed}"
    return json.loads((out_dir / "rank0.json").read_text())


# Per block, the bound on the sharded (all-reduced) output against the float64 reference. bf16 partials are
# summed in bf16 by the all-reduce, as in the deployment.
BOUNDS = {
    "bfloat16": {"moe": tolerances.MOE_BLOCK[torch.bfloat16], "gdn": tolerances.TP_LAYER_BF16, "attention": tolerances.TP_LAYER_BF16},
    "float32": {"moe": tolerances.MOE_BLOCK[torch.float32], "gdn": tolerances.TP_LAYER_F32, "attention": tolerances.TP_LAYER_F32},
}


def check_results(results: dict) -> None:
    assert results["blocks"], "the workers computed nothing"
    for key, errors in results["blocks"].items():
        block, dtype, _ = key.split("/")
        bound = BOUNDS[dtype][block]
        assert errors["sharded_vs_float64"] <= bound, f"{key}: {errors}"
        # Sharding may not cost more than rounding already does: within 2x the unsharded error plus the bound/10.
        assert errors["sharded_vs_unsharded"] <= 2 * errors["unsharded_vs_float64"] + bound / 10, f"{key}: {errors}"
        if "state_vs_unsharded" in errors:
            assert errors["state_vs_unsharded"] <= bound, f"{key}: {errors}"


def _report(results: dict, name: str) -> None:
    directory = os.environ.get("GPU_REPORT_DIR")
    if directory:
        Path(directory, name).write_text(json.dumps(results, indent=2, sort_keys=True))


@pytest.mark.slow
def test_sharded_blocks_over_gloo_equal_unsharded_on_cpu(tmp_path):
    results = run_ranks(2, "gloo", "small", tmp_path, timeout_s=600)
    check_results(results)


@pytest.mark.gpu
def test_sharded_blocks_over_nccl_equal_unsharded_on_gpus(tmp_path):
    count = torch.cuda.device_count()
    world = max((w for w in (8, 4, 2) if w <= count), default=0)
    if world < 2:
        pytest.skip(f"TP over NCCL needs at least 2 GPUs; this machine has {count}")
    results = run_ranks(world, "nccl", "real", tmp_path, timeout_s=900)
    _report(results, f"tp_nccl_{world}.json")
    check_results(results)
    assert results["world_size"] == world
