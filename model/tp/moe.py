"""MoE under tensor parallelism as vLLM shards it (TP without expert parallelism).

- router `gate` and `shared_expert_gate`: ReplicatedLinear, every rank routes identically;
- routed experts (FusedMoE): every rank holds all experts, w13 keeps gate rows and up rows
  [r*I/tp, (r+1)*I/tp) each, w2 keeps input columns of that slice;
- shared expert: gate/up MergedColumnParallel, down RowParallel without its own reduce; the sigmoid gate,
  a replicated per-token scalar, multiplies each rank's partial;
- one all-reduce of (routed + shared) partials at the end of the block.
"""
from __future__ import annotations

import torch

from ..moe.block import MoEWeights
from ..moe.block_paths import moe_block
from ..moe.config import MoEConfig
from .common import all_reduce_sum, check_divisible, shard_columns, shard_rows

__all__ = ["shard_moe_weights", "moe_block_tp"]


def shard_moe_weights(w: MoEWeights, tp_size: int) -> list[MoEWeights]:
    """Per-rank MoE weights for ranks 0..tp_size-1."""
    inter = w.intermediate_size
    check_divisible("moe_intermediate_size", inter, tp_size)
    check_divisible("shared_expert_intermediate_size", w.shared_intermediate_size, tp_size)
    gate_rows, up_rows = w.w13[:, :inter], w.w13[:, inter:]
    ranks = []
    for r in range(tp_size):
        ranks.append(
            MoEWeights(
                router=w.router,
                w13=torch.cat(
                    [shard_rows(gate_rows, r, tp_size, dim=1), shard_rows(up_rows, r, tp_size, dim=1)], dim=1
                ),
                w2=shard_columns(w.w2, r, tp_size),
                shared_w1=shard_rows(w.shared_w1, r, tp_size),
                shared_w3=shard_rows(w.shared_w3, r, tp_size),
                shared_w2=shard_columns(w.shared_w2, r, tp_size),
                shared_gate=w.shared_gate,
                top_k=w.top_k,
            )
        )
    return ranks


def moe_block_tp(
    x: torch.Tensor,
    w: MoEWeights,
    tp_size: int,
    config: MoEConfig | None = None,
    router: str = "topk_softmax",
) -> torch.Tensor:
    """The MoE block computed rank by rank and all-reduced: equal to `moe_block` up to rounding."""
    partials = [moe_block(x, rank_w, config, router) for rank_w in shard_moe_weights(w, tp_size)]
    return all_reduce_sum(partials)
