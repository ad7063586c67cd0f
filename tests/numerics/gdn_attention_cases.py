"""Random inputs for the GDN, norm and attention properties, drawn from a seed (never zeros).

Weights are N(0, 1/fan_in) so activations stay O(1); norm weights are perturbed away from their init
(0 for zero-centred, 1 for the gated norm) so `w` vs `1 + w` mistakes show; the gating parameters follow
HF's init ranges (A in [0.01, 16], dt_bias around 1) so the decays span fast and slow heads.
"""
from __future__ import annotations

import torch

from model.attention.layer import AttentionDims, AttentionWeights, KVCache
from model.gdn import GDNDims, GDNState, GDNWeights, gdn_gating

# Tiny dims with the real model's ratios: HV = 2H value heads per key head, GQA 2:1, rotary 1/4 of head_dim.
TINY_GDN = GDNDims(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8, conv_kernel=4)
# Divisible by TP=4: 4 key heads, 8 value heads (the real per-layer ratio), as in the TP tests.
TP_GDN = GDNDims(hidden_size=32, num_k_heads=4, num_v_heads=8, head_k_dim=8, head_v_dim=8, conv_kernel=4)
TINY_ATTENTION = AttentionDims(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=16, rotary_dim=4, rope_theta=1e4)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(gen: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def uniform(gen: torch.Generator, *shape: int, low: float, high: float) -> torch.Tensor:
    return torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low


def rule_inputs(gen: torch.Generator, batch: int, tokens: int, dims: GDNDims, dtype: torch.dtype):
    """(q, k, v, g, beta) for the delta rule: q/k/v in `dtype`, g/beta from the real gating function."""
    q = randn(gen, batch, tokens, dims.num_k_heads, dims.head_k_dim, dtype=dtype)
    k = randn(gen, batch, tokens, dims.num_k_heads, dims.head_k_dim, dtype=dtype)
    v = randn(gen, batch, tokens, dims.num_v_heads, dims.head_v_dim, dtype=dtype)
    a = randn(gen, batch, tokens, dims.num_v_heads)
    b = randn(gen, batch, tokens, dims.num_v_heads)
    A_log = uniform(gen, dims.num_v_heads, low=0.01, high=16).log()
    dt_bias = 1.0 + randn(gen, dims.num_v_heads, scale=0.5, dtype=torch.float64)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    return q, k, v, g.to(ct), beta.to(ct)


def random_recurrent_state(gen: torch.Generator, batch: int, dims: GDNDims, dtype=torch.float32) -> torch.Tensor:
    return randn(gen, batch, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim, dtype=dtype, scale=0.5)


def random_gdn_state(gen: torch.Generator, batch: int, dims: GDNDims, dtype: torch.dtype) -> GDNState:
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return GDNState(
        conv=randn(gen, batch, dims.conv_dim, dims.conv_kernel - 1, dtype=dtype),
        recurrent=random_recurrent_state(gen, batch, dims, state_dtype),
    )


def random_gdn_weights(gen: torch.Generator, dims: GDNDims, dtype: torch.dtype = torch.float64) -> GDNWeights:
    h = dims.hidden_size
    return GDNWeights(
        in_proj_qkv=randn(gen, dims.conv_dim, h, dtype=dtype, scale=h**-0.5),
        in_proj_z=randn(gen, dims.value_dim, h, dtype=dtype, scale=h**-0.5),
        in_proj_b=randn(gen, dims.num_v_heads, h, dtype=dtype, scale=h**-0.5),
        in_proj_a=randn(gen, dims.num_v_heads, h, dtype=dtype, scale=h**-0.5),
        conv1d=randn(gen, dims.conv_dim, dims.conv_kernel, dtype=dtype, scale=0.5),
        A_log=uniform(gen, dims.num_v_heads, low=0.01, high=16).log().to(dtype),
        dt_bias=(1.0 + randn(gen, dims.num_v_heads, dtype=torch.float64, scale=0.5)).to(dtype),
        norm=(1.0 + randn(gen, dims.head_v_dim, dtype=torch.float64, scale=0.3)).to(dtype),
        out_proj=randn(gen, h, dims.value_dim, dtype=dtype, scale=dims.value_dim**-0.5),
        dims=dims,
    )


def random_attention_weights(gen: torch.Generator, dims: AttentionDims, dtype: torch.dtype = torch.float64) -> AttentionWeights:
    h, d = dims.hidden_size, dims.head_dim
    return AttentionWeights(
        q_proj=randn(gen, 2 * dims.num_heads * d, h, dtype=dtype, scale=h**-0.5),
        k_proj=randn(gen, dims.num_kv_heads * d, h, dtype=dtype, scale=h**-0.5),
        v_proj=randn(gen, dims.num_kv_heads * d, h, dtype=dtype, scale=h**-0.5),
        o_proj=randn(gen, h, dims.num_heads * d, dtype=dtype, scale=(dims.num_heads * d) ** -0.5),
        q_norm=randn(gen, d, dtype=dtype, scale=0.3),
        k_norm=randn(gen, d, dtype=dtype, scale=0.3),
        dims=dims,
    )


def concat_caches(a: KVCache, b: KVCache) -> KVCache:
    return KVCache(torch.cat([a.k, b.k], dim=2), torch.cat([a.v, b.v], dim=2))
