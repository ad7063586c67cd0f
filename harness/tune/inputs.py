"""Seeded random inputs for the tuner, drawn on the target device (never zeros: zeros run faster than real
data and hide unwritten outputs). Scales keep activations O(1): weights N(0, 1/fan_in); the GDN gating
parameters span HF's init ranges (A in [0.01, 16], dt_bias around 1) so decays cover fast and slow heads."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from model.gdn import GDNDims, GDNWeights, gdn_gating
from model.moe import MoEWeights, route_reference

from .dims import MoEDims

__all__ = ["generator", "moe_weights", "moe_hidden", "moe_routing", "gdn_rule_inputs", "gdn_weights", "gdn_hidden"]


def generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _randn(gen, shape, device, dtype, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)


def moe_weights(d: MoEDims, dtype: torch.dtype, device: torch.device, seed: int = 1) -> MoEWeights:
    gen = generator(device, seed)
    h, i, s = d.hidden, d.intermediate, d.shared_intermediate
    return MoEWeights(
        router=_randn(gen, (d.experts, h), device, dtype, 4 / math.sqrt(h)),
        w13=_randn(gen, (d.experts, 2 * i, h), device, dtype, 1 / math.sqrt(h)),
        w2=_randn(gen, (d.experts, h, i), device, dtype, 1 / math.sqrt(i)),
        shared_w1=_randn(gen, (s, h), device, dtype, 1 / math.sqrt(h)),
        shared_w3=_randn(gen, (s, h), device, dtype, 1 / math.sqrt(h)),
        shared_w2=_randn(gen, (h, s), device, dtype, 1 / math.sqrt(s)),
        shared_gate=_randn(gen, (1, h), device, dtype, 1 / math.sqrt(h)),
        top_k=d.top_k,
    )


def moe_hidden(tokens: int, d: MoEDims, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    return _randn(generator(device, seed), (tokens, d.hidden), device, dtype)


def moe_routing(x: torch.Tensor, w: MoEWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 weights and int64 ids of the top-k, from the block's own (low-precision) router logits."""
    return route_reference(F.linear(x, w.router), w.top_k)


def gdn_rule_inputs(batch: int, tokens: int, d: GDNDims, dtype: torch.dtype, device: torch.device, seed: int):
    """(q, k, v, g, beta, initial_state): q/k/v in `dtype`, g/beta float32 from the real gating function,
    a random float32 state [B, HV, K, V] (not zeros: the hand-over from an earlier chunk is part of the work)."""
    gen = generator(device, seed)
    q = _randn(gen, (batch, tokens, d.num_k_heads, d.head_k_dim), device, dtype)
    k = _randn(gen, (batch, tokens, d.num_k_heads, d.head_k_dim), device, dtype)
    v = _randn(gen, (batch, tokens, d.num_v_heads, d.head_v_dim), device, dtype)
    a = _randn(gen, (batch, tokens, d.num_v_heads), device, torch.float32)
    b = _randn(gen, (batch, tokens, d.num_v_heads), device, torch.float32)
    A_log = (torch.rand(d.num_v_heads, generator=gen, device=device) * (16 - 0.01) + 0.01).log()
    dt_bias = 1.0 + _randn(gen, (d.num_v_heads,), device, torch.float32, 0.5)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    state = _randn(gen, (batch, d.num_v_heads, d.head_k_dim, d.head_v_dim), device, torch.float32, 0.5)
    return q, k, v, g, beta, state


def gdn_weights(d: GDNDims, dtype: torch.dtype, device: torch.device, seed: int = 2) -> GDNWeights:
    gen = generator(device, seed)
    h = d.hidden_size
    return GDNWeights(
        in_proj_qkv=_randn(gen, (d.conv_dim, h), device, dtype, h**-0.5),
        in_proj_z=_randn(gen, (d.value_dim, h), device, dtype, h**-0.5),
        in_proj_b=_randn(gen, (d.num_v_heads, h), device, dtype, h**-0.5),
        in_proj_a=_randn(gen, (d.num_v_heads, h), device, dtype, h**-0.5),
        conv1d=_randn(gen, (d.conv_dim, d.conv_kernel), device, dtype, 0.5),
        A_log=(torch.rand(d.num_v_heads, generator=gen, device=device) * (16 - 0.01) + 0.01).log().to(dtype),
        dt_bias=(1.0 + _randn(gen, (d.num_v_heads,), device, torch.float32, 0.5)).to(dtype),
        norm=(1.0 + _randn(gen, (d.head_v_dim,), device, torch.float32, 0.3)).to(dtype),
        out_proj=_randn(gen, (h, d.value_dim), device, dtype, d.value_dim**-0.5),
        dims=d,
    )


def gdn_hidden(batch: int, tokens: int, d: GDNDims, dtype: torch.dtype, device: torch.device, seed: int):
    return _randn(generator(device, seed), (batch, tokens, d.hidden_size), device, dtype)
