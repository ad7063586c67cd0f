"""Partial NeoX rotary embedding as Qwen3.5/3.6 and Qwen3-Next apply it.

Only the first `rotary_dim` dims of a head rotate (head_dim * partial_rotary_factor, a quarter for Qwen3.5);
pairs are (i, i + rotary_dim/2) (NeoX half rotation); the other dims pass through.
For text-only input Qwen3.5's interleaved mRoPE reduces to this: its three position rows are equal.
"""
from __future__ import annotations

import torch

__all__ = ["rope_cos_sin", "apply_partial_rope", "rotary_dim_for"]


def rotary_dim_for(head_dim: int, partial_rotary_factor: float) -> int:
    dim = int(head_dim * partial_rotary_factor)
    if dim % 2 or not 0 < dim <= head_dim:
        raise ValueError(
            f"head_dim={head_dim} * partial_rotary_factor={partial_rotary_factor} gives rotary_dim={dim}; "
            "it must be even and in (0, head_dim]"
        )
    return dim


def rope_cos_sin(
    positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rotary_dim] for integer `positions` [T], computed in float64 and cast to `dtype`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=positions.device) / rotary_dim))
    freqs = positions.to(torch.float64)[:, None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, head_dim] with its first cos.shape[-1] dims rotated by position."""
    rotary_dim = cos.shape[-1]
    rot, passthrough = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * cos + rotated_half * sin, passthrough], dim=-1)
