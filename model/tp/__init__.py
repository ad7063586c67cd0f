"""Tensor-parallel sharding exactly as vLLM does it, simulated on one device.

Each block module slices full HF weights into per-rank weights and runs the rank-local computation; the
all-reduce is `all_reduce_sum` over the rank partials (on real GPUs, NCCL's all-reduce takes its place).
"""
from .attention import gated_attention_tp, kv_heads_for_rank, shard_attention_weights
from .common import all_reduce_sum, check_divisible, shard_columns, shard_rows
from .gdn import (
    GDNRankWeights,
    gather_gdn_state,
    gdn_layer_tp,
    local_gdn_dims,
    shard_gdn_state,
    shard_gdn_weights,
    shard_qwen3_next_projections,
)
from .moe import moe_block_tp, shard_moe_weights

__all__ = [
    "GDNRankWeights",
    "all_reduce_sum",
    "check_divisible",
    "gated_attention_tp",
    "gather_gdn_state",
    "gdn_layer_tp",
    "kv_heads_for_rank",
    "local_gdn_dims",
    "moe_block_tp",
    "shard_attention_weights",
    "shard_columns",
    "shard_gdn_state",
    "shard_gdn_weights",
    "shard_moe_weights",
    "shard_qwen3_next_projections",
    "shard_rows",
]
