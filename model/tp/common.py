"""Slicing rules shared by every sharded block (vLLM's ColumnParallel / RowParallel conventions)."""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["check_divisible", "shard_rows", "shard_columns", "all_reduce_sum"]


def check_divisible(what: str, size: int, tp_size: int) -> int:
    """size // tp_size, or an error naming the dimension that TP cannot split."""
    if tp_size < 1:
        raise ValueError(f"tp_size={tp_size} must be a positive integer")
    if size % tp_size:
        raise ValueError(f"{what}={size} is not divisible by tp_size={tp_size}; choose a TP size that divides it")
    return size // tp_size


def shard_rows(weight: torch.Tensor, rank: int, tp_size: int, dim: int = 0, what: str = "rows") -> torch.Tensor:
    """ColumnParallel: rank r keeps the contiguous slice [r*n/tp, (r+1)*n/tp) of `dim`."""
    shard = check_divisible(what, weight.shape[dim], tp_size)
    return weight.narrow(dim, rank * shard, shard)


def shard_columns(weight: torch.Tensor, rank: int, tp_size: int, what: str = "columns") -> torch.Tensor:
    """RowParallel: rank r keeps input columns [r*n/tp, (r+1)*n/tp) of the last dim."""
    return shard_rows(weight, rank, tp_size, dim=weight.dim() - 1, what=what)


def all_reduce_sum(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """The all-reduce: the sum of the rank partials, in rank order."""
    if not partials:
        raise ValueError("all_reduce_sum needs at least one rank partial")
    total = partials[0].clone()
    for partial in partials[1:]:
        total += partial
    return total
