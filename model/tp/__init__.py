"""Tensor-parallel sharding exactly as vLLM does it, simulated on one device.

Each block module slices full HF weights into per-rank weights and runs the rank-local computation; the
all-reduce is `all_reduce_sum` over the rank partials (on real GPUs, NCCL's all-reduce takes its place).
"""
from .common import all_reduce_sum, check_divisible, shard_columns, shard_rows
from .moe import moe_block_tp, shard_moe_weights

__all__ = ["all_reduce_sum", "check_divisible", "moe_block_tp", "shard_columns", "shard_moe_weights", "shard_rows"]
