"""Gated full attention under tensor parallelism as vLLM shards it (QKVParallelLinear + RowParallel o_proj).

Per rank r of tp (NH query heads, NKV kv heads):
- q_proj rows (query + gate, head-major): heads [r*NH/tp, (r+1)*NH/tp), i.e. a contiguous row block;
- k_proj / v_proj: when NKV >= tp, kv heads [r*NKV/tp, ...); when NKV < tp, every kv head is replicated on
  tp/NKV ranks and rank r holds kv head r // (tp/NKV) (vLLM's `num_kv_head_replicas`). Either way the
  rank's query heads h read kv head h // (NH/NKV), so GQA stays consistent;
- q_norm / k_norm: replicated; RoPE is local;
- o_proj (RowParallel): input columns of the rank's heads, then the all-reduce (a sum here).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..attention.layer import AttentionWeights, KVCache, gated_attention
from .common import all_reduce_sum, check_divisible, shard_columns, shard_rows

__all__ = ["kv_heads_for_rank", "shard_attention_weights", "gated_attention_tp"]


def kv_heads_for_rank(rank: int, tp_size: int, num_kv_heads: int) -> range:
    """The kv heads rank `rank` holds, with vLLM's replication when there are fewer kv heads than ranks."""
    if num_kv_heads >= tp_size:
        per_rank = check_divisible("num_key_value_heads", num_kv_heads, tp_size)
        return range(rank * per_rank, (rank + 1) * per_rank)
    if tp_size % num_kv_heads:
        raise ValueError(
            f"tp_size={tp_size} is not a multiple of num_key_value_heads={num_kv_heads}: vLLM replicates each "
            "kv head on tp/num_kv_heads ranks, so choose a TP size that divides or is a multiple of it"
        )
    replicas = tp_size // num_kv_heads
    return range(rank // replicas, rank // replicas + 1)


def shard_attention_weights(w: AttentionWeights, tp_size: int) -> list[AttentionWeights]:
    d = w.dims
    check_divisible("num_attention_heads", d.num_heads, tp_size)
    kv_rows = d.head_dim
    ranks = []
    for r in range(tp_size):
        heads = kv_heads_for_rank(r, tp_size, d.num_kv_heads)
        rows = slice(heads.start * kv_rows, heads.stop * kv_rows)
        ranks.append(
            AttentionWeights(
                q_proj=shard_rows(w.q_proj, r, tp_size, what="q_proj rows (query + gate)"),
                k_proj=w.k_proj[rows],
                v_proj=w.v_proj[rows],
                o_proj=shard_columns(w.o_proj, r, tp_size),
                q_norm=w.q_norm,
                k_norm=w.k_norm,
                dims=replace(d, num_heads=d.num_heads // tp_size, num_kv_heads=len(heads)),
            )
        )
    return ranks


def gated_attention_tp(
    x: torch.Tensor,
    w: AttentionWeights,
    tp_size: int,
    caches: list[KVCache] | None = None,
    **paths: str,
) -> tuple[torch.Tensor, list[KVCache]]:
    """Attention computed rank by rank (each with its own KV cache) and all-reduced after o_proj."""
    caches = [None] * tp_size if caches is None else caches
    if len(caches) != tp_size:
        raise ValueError(f"{len(caches)} per-rank KV caches for tp_size={tp_size}")
    outs = [gated_attention(x, rank_w, c, **paths) for rank_w, c in zip(shard_attention_weights(w, tp_size), caches)]
    return all_reduce_sum([y for y, _ in outs]), [c for _, c in outs]
