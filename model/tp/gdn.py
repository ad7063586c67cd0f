"""The GDN layer under tensor parallelism as vLLM shards it (Qwen3.5: `gqa_interleaved_layout=False`).

Per rank r of tp (H key heads, HV value heads; r takes key heads [r*H/tp, (r+1)*H/tp) and the value heads
that read them):
- `in_proj_qkvz` (MergedColumnParallel over [key_dim, key_dim, value_dim, value_dim]): each sub-matrix
  sliced contiguously, rank weight [q_r | k_r | v_r | z_r]; the forward splits it at (2*key_dim+value_dim)/tp;
- `in_proj_ba` (MergedColumnParallel over [HV, HV]): [b_r | a_r], then `chunk(2)`;
- `conv1d`: the q, k and v channel blocks each sliced contiguously (depthwise, so exact);
- `A_log`, `dt_bias`: sliced by value head; gated-norm weight: replicated;
- `out_proj` (RowParallel): input columns [r*value_dim/tp, ...), then the all-reduce (a sum here).
Each rank keeps its own conv state (its channels) and recurrent state (its value heads).
Qwen3-Next's fused, per-key-head-grouped `in_proj_qkvz`/`in_proj_ba` shard as one block of whole groups
per rank (`shard_qwen3_next_projections`); converted, that is the same rank weight.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..gdn import GDNDims, GDNState, GDNWeights, gdn_layer
from .common import all_reduce_sum, check_divisible, shard_columns, shard_rows

__all__ = [
    "GDNRankWeights",
    "local_gdn_dims",
    "shard_gdn_weights",
    "shard_qwen3_next_projections",
    "shard_gdn_state",
    "gather_gdn_state",
    "gdn_layer_tp",
]


def local_gdn_dims(dims: GDNDims, tp_size: int) -> GDNDims:
    """The per-rank dims: key and value heads divided by tp (whole key-head groups per rank)."""
    return replace(
        dims,
        num_k_heads=check_divisible("linear_num_key_heads", dims.num_k_heads, tp_size),
        num_v_heads=check_divisible("linear_num_value_heads", dims.num_v_heads, tp_size),
    )


@dataclass(frozen=True)
class GDNRankWeights:
    """One rank's weights in vLLM's merged per-rank layout."""

    in_proj_qkvz: torch.Tensor  # [(2*key_dim + 2*value_dim)/tp, hidden] = [q_r | k_r | v_r | z_r]
    in_proj_ba: torch.Tensor  # [2*HV/tp, hidden] = [b_r | a_r]
    conv1d: torch.Tensor  # [conv_dim/tp, W] = [q_r | k_r | v_r] channels
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    norm: torch.Tensor
    out_proj: torch.Tensor  # [hidden, value_dim/tp]
    dims: GDNDims  # local dims

    def layer_weights(self) -> GDNWeights:
        """Split the merged weights as vLLM's forward does, into a rank-local GDN layer."""
        d = self.dims
        qkv, z = self.in_proj_qkvz.split([d.conv_dim, d.value_dim], dim=0)
        b, a = self.in_proj_ba.chunk(2, dim=0)
        return GDNWeights(
            in_proj_qkv=qkv, in_proj_z=z, in_proj_b=b, in_proj_a=a, conv1d=self.conv1d, A_log=self.A_log,
            dt_bias=self.dt_bias, norm=self.norm, out_proj=self.out_proj, dims=d,
        )


def _split_qkv(t: torch.Tensor, dims: GDNDims, dim: int = 0):
    return t.split([dims.key_dim, dims.key_dim, dims.value_dim], dim=dim)


def shard_gdn_weights(w: GDNWeights, tp_size: int) -> list[GDNRankWeights]:
    local = local_gdn_dims(w.dims, tp_size)
    ranks = []
    for r in range(tp_size):
        q, k, v = (shard_rows(t, r, tp_size) for t in _split_qkv(w.in_proj_qkv, w.dims))
        z = shard_rows(w.in_proj_z, r, tp_size)
        conv = torch.cat([shard_rows(t, r, tp_size) for t in _split_qkv(w.conv1d, w.dims)], dim=0)
        ranks.append(
            GDNRankWeights(
                in_proj_qkvz=torch.cat([q, k, v, z], dim=0),
                in_proj_ba=torch.cat([shard_rows(w.in_proj_b, r, tp_size), shard_rows(w.in_proj_a, r, tp_size)]),
                conv1d=conv,
                A_log=shard_rows(w.A_log, r, tp_size),
                dt_bias=shard_rows(w.dt_bias, r, tp_size),
                norm=w.norm,
                out_proj=shard_columns(w.out_proj, r, tp_size),
                dims=local,
            )
        )
    return ranks


def shard_qwen3_next_projections(
    in_proj_qkvz: torch.Tensor, in_proj_ba: torch.Tensor, dims: GDNDims, tp_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-rank (in_proj_qkvz, in_proj_ba) of the Qwen3-Next grouped layout: one contiguous block of whole
    key-head groups per rank (`gqa_interleaved_layout=True`), still grouped; convert with the local dims."""
    check_divisible("linear_num_key_heads", dims.num_k_heads, tp_size)
    return [(shard_rows(in_proj_qkvz, r, tp_size), shard_rows(in_proj_ba, r, tp_size)) for r in range(tp_size)]


def shard_gdn_state(state: GDNState, dims: GDNDims, tp_size: int) -> list[GDNState]:
    """Per-rank states: conv channels sliced like the conv weight, recurrent state by value head."""
    ranks = []
    for r in range(tp_size):
        conv = torch.cat([shard_rows(t, r, tp_size, dim=1) for t in _split_qkv(state.conv, dims, dim=1)], dim=1)
        ranks.append(GDNState(conv=conv, recurrent=shard_rows(state.recurrent, r, tp_size, dim=1)))
    return ranks


def gather_gdn_state(states: list[GDNState], dims: GDNDims) -> GDNState:
    """The unsharded state from per-rank states (inverse of `shard_gdn_state`)."""
    local = local_gdn_dims(dims, len(states))
    pieces = [_split_qkv(s.conv, local, dim=1) for s in states]
    conv = torch.cat([torch.cat([p[i] for p in pieces], dim=1) for i in range(3)], dim=1)
    return GDNState(conv=conv, recurrent=torch.cat([s.recurrent for s in states], dim=1))


def gdn_layer_tp(
    x: torch.Tensor,
    w: GDNWeights,
    tp_size: int,
    states: list[GDNState] | None = None,
    **paths: str,
) -> tuple[torch.Tensor, list[GDNState]]:
    """The GDN layer computed rank by rank and all-reduced after out_proj; returns the per-rank states."""
    ranks = shard_gdn_weights(w, tp_size)
    states = [None] * tp_size if states is None else states
    if len(states) != tp_size:
        raise ValueError(f"{len(states)} per-rank states for tp_size={tp_size}")
    outs = [gdn_layer(x, rank.layer_weights(), s, **paths) for rank, s in zip(ranks, states)]
    return all_reduce_sum([y for y, _ in outs]), [s for _, s in outs]
