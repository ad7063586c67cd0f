"""GDN projection layouts: Qwen3.5 (separate `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`) and
Qwen3-Next (fused `in_proj_qkvz`, `in_proj_ba`, grouped per key head), and the converter between them.

Qwen3.5:    in_proj_qkv rows = [q (H*K) | k (H*K) | v (HV*V)], in_proj_z rows = HV*V, b and a rows = HV.
Qwen3-Next: in_proj_qkvz rows grouped per key head h as [q_h (K) | k_h (K) | v_h (r*V) | z_h (r*V)],
            in_proj_ba rows grouped per key head as [b_h (r) | a_h (r)], with r = HV / H; the value
            heads of group h are h*r .. h*r + r-1 (HF's `fix_query_key_value_ordering`).
The conversion only permutes rows, so it is exact in any dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GDNDims", "qwen3_next_to_qwen35", "qwen35_to_qwen3_next"]


@dataclass(frozen=True)
class GDNDims:
    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int = 4
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"linear_num_value_heads={self.num_v_heads} is not a multiple of linear_num_key_heads="
                f"{self.num_k_heads}: each key head must serve a whole group of value heads"
            )
        if self.conv_kernel < 2:
            raise ValueError(f"linear_conv_kernel_dim={self.conv_kernel}: the causal conv needs a kernel of at least 2")

    @property
    def group(self) -> int:
        return self.num_v_heads // self.num_k_heads

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


def _check_rows(name: str, t: torch.Tensor, rows: int, dims: GDNDims) -> None:
    if t.dim() != 2 or t.shape[0] != rows:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [{rows}, hidden] for {dims}")


def qwen3_next_to_qwen35(
    in_proj_qkvz: torch.Tensor, in_proj_ba: torch.Tensor, dims: GDNDims
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) from the fused, per-key-head-grouped weights."""
    h, kd, vd, r = dims.num_k_heads, dims.head_k_dim, dims.head_v_dim, dims.group
    _check_rows("in_proj_qkvz", in_proj_qkvz, 2 * dims.key_dim + 2 * dims.value_dim, dims)
    _check_rows("in_proj_ba", in_proj_ba, 2 * dims.num_v_heads, dims)
    hidden = in_proj_qkvz.shape[1]
    grouped = in_proj_qkvz.reshape(h, 2 * kd + 2 * r * vd, hidden)
    q, k, v, z = grouped.split([kd, kd, r * vd, r * vd], dim=1)
    qkv = torch.cat([t.reshape(-1, hidden) for t in (q, k, v)], dim=0)
    b, a = in_proj_ba.reshape(h, 2 * r, hidden).split([r, r], dim=1)
    return qkv, z.reshape(-1, hidden), b.reshape(-1, hidden), a.reshape(-1, hidden)


def qwen35_to_qwen3_next(
    in_proj_qkv: torch.Tensor, in_proj_z: torch.Tensor, in_proj_b: torch.Tensor, in_proj_a: torch.Tensor, dims: GDNDims
) -> tuple[torch.Tensor, torch.Tensor]:
    """(in_proj_qkvz, in_proj_ba) in the Qwen3-Next grouped layout: the inverse of `qwen3_next_to_qwen35`."""
    h, r = dims.num_k_heads, dims.group
    _check_rows("in_proj_qkv", in_proj_qkv, dims.conv_dim, dims)
    _check_rows("in_proj_z", in_proj_z, dims.value_dim, dims)
    _check_rows("in_proj_b", in_proj_b, dims.num_v_heads, dims)
    _check_rows("in_proj_a", in_proj_a, dims.num_v_heads, dims)
    hidden = in_proj_qkv.shape[1]
    q, k, v = in_proj_qkv.split([dims.key_dim, dims.key_dim, dims.value_dim], dim=0)
    per_head = [t.reshape(h, -1, hidden) for t in (q, k, v, in_proj_z)]
    qkvz = torch.cat(per_head, dim=1).reshape(-1, hidden)
    ba = torch.cat([in_proj_b.reshape(h, r, hidden), in_proj_a.reshape(h, r, hidden)], dim=1).reshape(-1, hidden)
    return qkvz, ba
