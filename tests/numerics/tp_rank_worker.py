"""One rank of the real tensor-parallel check: `python -m tests.numerics.tp_rank_worker --out FILE`.

Launched once per rank by tests/numerics/test_tp_distributed.py with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
(`--backend gloo --dims small` runs the same code on CPU processes, which CI does).
Every rank builds the same full weights (seeded, checked by comparing checksums across ranks), computes its
shard with the `model.tp` slicing rules, and all-reduces the partial outputs with NCCL in the activation
dtype, as the deployment does. It also runs the unsharded block on its own GPU and the float64 reference,
and writes the errors (and the all-reduced output's checksum, to check that all ranks agree) as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from model.attention.layer import AttentionDims, gated_attention
from model.gdn import GDNDims, gdn_layer
from model.moe import MoEConfig, moe_block
from model.tp import shard_attention_weights, shard_gdn_weights, shard_moe_weights
from tests.numerics.compare import relative_error
from tests.numerics.gdn_attention_cases import generator, random_attention_weights, random_gdn_weights
from tests.numerics.moe_cases import MoECase, block_reference, make_hidden, make_moe_weights

# The real model's unsharded dims (the per-rank dims are these divided by the world size), and small ones
# with the same structure (KV heads fewer than ranks at TP=4, whole key-head groups per rank).
DIMS = {
    "real": dict(
        moe=dict(experts=256, top_k=8, hidden=2048, intermediate=512, shared_intermediate=512),
        gdn=GDNDims(hidden_size=2048, num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128),
        attention=AttentionDims(hidden_size=2048, num_heads=16, num_kv_heads=2, head_dim=256, rotary_dim=64, rope_theta=1e7),
        tokens=(1, 4, 300),
    ),
    "small": dict(
        moe=dict(experts=16, top_k=4, hidden=64, intermediate=32, shared_intermediate=32),
        gdn=GDNDims(hidden_size=64, num_k_heads=4, num_v_heads=8, head_k_dim=16, head_v_dim=16),
        attention=AttentionDims(hidden_size=64, num_heads=8, num_kv_heads=2, head_dim=16, rotary_dim=4, rope_theta=1e4),
        tokens=(1, 70),
    ),
}


def _all_reduced(partial: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(partial)  # NCCL sums in the tensor's dtype, like vLLM's tensor_model_parallel_all_reduce
    return partial


def _checksum(t: torch.Tensor) -> float:
    return float(t.double().sum().item()) + float((t.double() ** 2).sum().item())


def _assert_same_on_all_ranks(value: float, what: str) -> None:
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    if len(set(gathered)) != 1:
        raise RuntimeError(f"{what} differs between ranks: {gathered}")


def moe_results(rank: int, world: int, device: str, dtype: torch.dtype, tokens: int, dims: dict) -> dict:
    case = MoECase(tokens=tokens, pattern="random", seed=tokens, **dims["moe"])
    w = make_moe_weights(case, dtype, device)
    x = make_hidden(case, dtype, device)
    _assert_same_on_all_ranks(_checksum(w.w13) + _checksum(x), "MoE weights")
    sharded = _all_reduced(moe_block(x, shard_moe_weights(w, world)[rank], MoEConfig()))
    unsharded = moe_block(x, w, MoEConfig())
    ref, scale = block_reference(x, w)
    return _errors(sharded, unsharded, ref, scale)


def gdn_results(rank: int, world: int, device: str, dtype: torch.dtype, tokens: int, dims: dict) -> dict:
    gdn = dims["gdn"]
    w64 = random_gdn_weights(generator(tokens), gdn, torch.float64)
    x64 = torch.randn(1, tokens, gdn.hidden_size, generator=generator(tokens + 1), dtype=torch.float64)
    w, x = w64.to(dtype, device), x64.to(device=device, dtype=dtype)
    _assert_same_on_all_ranks(_checksum(w.in_proj_qkv) + _checksum(x), "GDN weights")
    rank_w = shard_gdn_weights(w, world)[rank].layer_weights()
    partial, rank_state = gdn_layer(x, rank_w)
    sharded = _all_reduced(partial)
    unsharded, state = gdn_layer(x, w)
    ref, _ = gdn_layer(x.double(), w.to(torch.float64))
    errors = _errors(sharded, unsharded, ref, ref.norm().item())
    # The rank's recurrent state must be its slice of the unsharded state (value heads, contiguous).
    heads = gdn.num_v_heads // world
    errors["state_vs_unsharded"] = relative_error(rank_state.recurrent, state.recurrent[:, rank * heads : (rank + 1) * heads])
    return errors


def attention_results(rank: int, world: int, device: str, dtype: torch.dtype, tokens: int, dims: dict) -> dict:
    attention = dims["attention"]
    w64 = random_attention_weights(generator(tokens + 2), attention, torch.float64)
    x64 = torch.randn(1, tokens, attention.hidden_size, generator=generator(tokens + 3), dtype=torch.float64)
    w, x = w64.to(dtype, device), x64.to(device=device, dtype=dtype)
    _assert_same_on_all_ranks(_checksum(w.q_proj) + _checksum(x), "attention weights")
    partial, _ = gated_attention(x, shard_attention_weights(w, world)[rank])
    sharded = _all_reduced(partial)
    unsharded, _ = gated_attention(x, w)
    ref, _ = gated_attention(x.double(), w.to(torch.float64), core="reference", norm="reference")
    return _errors(sharded, unsharded, ref, ref.norm().item())


def _errors(sharded, unsharded, ref, scale) -> dict:
    _assert_same_on_all_ranks(_checksum(sharded), "the all-reduced output")
    return {
        "sharded_vs_float64": relative_error(sharded, ref, scale),
        "unsharded_vs_float64": relative_error(unsharded, ref, scale),
        "sharded_vs_unsharded": relative_error(sharded, unsharded, scale),
    }


BLOCKS = {"moe": moe_results, "gdn": gdn_results, "attention": attention_results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="JSON file this rank writes its results to")
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--dims", choices=sorted(DIMS), default="real")
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dims = DIMS[args.dims]
    if args.backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device(device))
        where = {"device": torch.cuda.get_device_name(rank), "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    else:
        device = "cpu"
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        where = {"device": "cpu"}
    results = {"world_size": world, "backend": args.backend, "dims": args.dims, "torch": torch.__version__,
               "blocks": {}, **where}
    started = time.perf_counter()
    try:
        for block, run in BLOCKS.items():
            for dtype in (torch.bfloat16, torch.float32):
                for tokens in dims["tokens"]:
                    key = f"{block}/{str(dtype).removeprefix('torch.')}/T{tokens}"
                    with torch.no_grad():
                        results["blocks"][key] = run(rank, world, device, dtype, tokens, dims)
        results["seconds"] = round(time.perf_counter() - started, 2)
    finally:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2, sort_keys=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
