"""What each served substitute adds to a vLLM layer's call above the model block it calls: host time, in-process
on vLLM's CPU build.

An eager platform pays every Python line between vLLM's call and the model's kernels, per layer and token. So the
adapter (the substitute's checks, the per-call choice, its bookkeeping, the argument order) must cost less than the
block it serves. vLLM's own layers are built here at the tiny model's dims (harness/serving/vllm_inprocess.py) with
the served substitutes registered and forced (QWEN36_SERVED_BLOCKS_FORCE: the model's serving choice on this CPU:
`fused` norms, the `composed` MoE block), and at each batch size, in interleaved rounds:
- the substitute's call as vLLM makes it (`norm(x, residual)`, `gated(x, z)`, the MoE runner's
  `forward(x, router_logits=x)`), and
- the model block it serves, called directly with the same inputs (the path's function over the same weights).
The adapter's cost is the difference of the two medians (per call, over `--rounds` rounds of `--calls` calls each,
after one unrecorded round). It includes nn.Module's own call machinery, which vLLM's own layer pays as well: an
upper bound. A CPU runs the block's arithmetic on the same core, so the block time here is the CPU's, not a GPU's.

    python3 -m harness.tune.step.adapter_cost --out adapter.json

tests/perf_gates/test_served_adapter_cost.py runs it (a timing test: alone) and fails where an adapter costs more
than its block.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

BATCHES = (1, 8)


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1e3


def compare(served: Callable[[], object], block: Callable[[], object], rounds: int, calls: int) -> dict:
    """Medians of per-call µs over interleaved rounds (the order alternates, so a drift of the machine falls on both),
    and the adapter's cost: served - block."""
    sides: dict[str, list[float]] = {"served": [], "block": []}
    with torch.no_grad():
        for fn in (served, block):  # one unrecorded round: first calls build what a layer keeps (weights, plans)
            per_call_us(fn, calls)
        for i in range(rounds):
            order = (("served", served), ("block", block)) if i % 2 == 0 else (("block", block), ("served", served))
            for name, fn in order:
                sides[name].append(per_call_us(fn, calls))
    served_us, block_us = statistics.median(sides["served"]), statistics.median(sides["block"])
    return {"served_us": served_us, "block_us": block_us, "adapter_us": served_us - block_us,
            "adapter_over_block": (served_us - block_us) / block_us,
            "spread": {k: (max(v) - min(v)) / min(v) for k, v in sides.items()}}


def _calls(cfg, layers, batch: int) -> dict[str, tuple[Callable, Callable]]:
    """block -> (the substitute's call, the model block's call) at `batch` tokens."""
    from model.moe import MOE_BLOCK_PATHS
    from model.norm.rms_norm import ADD_RMS_NORM_PATHS, GATED_NORM_PATHS
    from patches.model_paths import served_moe, served_norms
    from patches.model_paths.moe_router import router_name_for

    norm, gated, moe = layers
    hidden = cfg.model_config.hf_text_config.hidden_size
    g = torch.Generator().manual_seed(batch)
    x, residual = (torch.randn(batch, hidden, generator=g).to(torch.bfloat16) for _ in range(2))
    heads, v_dim = cfg.model_config.hf_text_config.linear_num_value_heads, gated.weight.shape[0]
    xv, zv = (torch.randn(batch * heads, v_dim, generator=g).to(torch.bfloat16) for _ in range(2))
    cpu, dtype = torch.device("cpu"), torch.bfloat16
    add_path = served_norms.ADD_NORM.default(batch, cpu, dtype)
    gated_path = served_norms.GATED_NORM.default(batch * heads, cpu, dtype)
    runner = moe.experts
    moe_path = served_moe.BLOCK.default(batch, cpu, dtype)
    router = router_name_for(cpu, dtype)

    def moe_block():
        return MOE_BLOCK_PATHS[moe_path].fn(x, runner._qwen36_block, served_moe._Runtime.config, router)

    return {
        "add_rms_norm": (lambda: norm(x, residual),
                         lambda: ADD_RMS_NORM_PATHS[add_path].fn(residual, x, norm.weight, norm.variance_epsilon)),
        "gdn_gated_norm": (lambda: gated(xv, zv), lambda: GATED_NORM_PATHS[gated_path].fn(xv, gated.weight,
                                                                                           gated.eps, zv)),
        "moe_block": (lambda: runner(x, router_logits=x), moe_block),
    }


def _layers(cfg):
    from harness.serving import vllm_inprocess

    from .served_launches import norm_layers

    g = torch.Generator().manual_seed(0)
    norm, gated = norm_layers(cfg, g)
    shapes = vllm_inprocess.moe_block_shapes(cfg)
    weights = {name: torch.randn(shape, generator=g) * 0.1 for name, shape in shapes.items()}
    moe = vllm_inprocess.build_moe_block(cfg, "model.layers.1.mlp_adapter_cost", weights, torch.device("cpu"))
    return norm, gated, moe


def measure(rounds: int, calls: int) -> dict:
    from vllm.forward_context import set_forward_context

    from harness.machine.speed import machine_kind
    from harness.serving import vllm_inprocess
    from harness.serving.tiny_model import TinyRecipe
    from patches.core.registry import PatchState, apply_patches
    from patches.model_paths import served_moe, served_norms
    from patches.settings import SERVED_FORCE_ENV, PatchSettings

    served_patches = (served_norms.PATCH, served_moe.PATCH)
    cfg = vllm_inprocess.eager_config(TinyRecipe.load().hf_config(eos_id=1, pad_id=0), torch.bfloat16)
    result = {"cpu": machine_kind(), "torch": torch.__version__, "dims": "the tiny model, bf16",
              "timing": f"median per call over {rounds} interleaved rounds of {calls} calls (host clock)",
              "batches": {}}
    env = {**{patch.switch: "1" for patch in served_patches}, SERVED_FORCE_ENV: "1"}
    with vllm_inprocess.process_groups(cfg):
        rows = apply_patches(PatchSettings.from_env(env, served_patches), served_patches)
        if any(r.state is not PatchState.APPLIED for r in rows):
            raise RuntimeError("; ".join(f"{r.name} {r.state.value}: {r.detail}" for r in rows))
        try:
            layers = _layers(cfg)
            with set_forward_context(None, cfg):
                for batch in BATCHES:
                    result["batches"][str(batch)] = {
                        block: compare(served, block_call, rounds, calls)
                        for block, (served, block_call) in _calls(cfg, layers, batch).items()}
        finally:
            for patch in served_patches:
                patch.uninstall()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    result = measure(a.rounds, a.calls)
    print(f"served adapters' cost on {result['cpu']} ({result['timing']}):")
    for batch, blocks in result["batches"].items():
        for block, r in blocks.items():
            print(f"  B={batch} {block:15} served {r['served_us']:8.1f} us  block {r['block_us']:8.1f} us  adapter "
                  f"{r['adapter_us']:6.1f} us ({r['adapter_over_block']:.0%} of the block)")
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
