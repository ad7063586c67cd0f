"""Seeded random inputs for the tuner, drawn on the target device (never zeros: zeros run faster than real
data and hide unwritten outputs). Scales keep activations O(1): weights N(0, 1/fan_in); the GDN gating
parameters span HF's init ranges (A in [0.01, 16], dt_bias around 1) so decays cover fast and slow heads;
zero-centred norm weights (used as 1 + w) stay near 0. The whole model comes at one rank's shapes under
vLLM's tensor parallelism (`rank_config`, `rank_weights`), built directly at those shapes."""
from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from model.attention.layer import AttentionDims, AttentionWeights
from model.gdn import GDNDims, GDNWeights, gdn_gating
from model.moe import MoEWeights, route_reference
from model.qwen36 import DenseMLPWeights, LayerWeights, Qwen36Config, Qwen36Weights
from model.rows import stack_rows
from model.tp import check_divisible, kv_heads_for_rank

from .dims import MoEDims
from .floors import moe_dims_of

__all__ = ["generator", "moe_weights", "moe_hidden", "moe_routing", "gdn_rule_inputs", "gdn_conv_inputs",
           "gated_norm_inputs", "gdn_weights", "gdn_hidden",
           "attention_weights", "rank_config", "rank_weights", "VOCAB_PADDING"]

# vLLM's VocabParallelEmbedding / ParallelLMHead pad the vocabulary to a multiple of 64
# (DEFAULT_VOCAB_PADDING_SIZE) and give each rank an equal contiguous slice: 248320 / 4 = 62080 rows at TP=4.
VOCAB_PADDING = 64
NORM_SCALE = 0.1  # zero-centred norm weights: 1 + N(0, 0.1^2)


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


def gdn_conv_inputs(batch: int, tokens: int, d: GDNDims, dtype: torch.dtype, device: torch.device, seed: int):
    """(x [B, T, conv_dim], weight [conv_dim, W], state [B, conv_dim, W-1]) in `dtype`: the layer's q/k/v
    projection, its conv weight and a random conv state (a chunk after an earlier one, not a fresh sequence)."""
    gen = generator(device, seed)
    x = _randn(gen, (batch, tokens, d.conv_dim), device, dtype)
    weight = _randn(gen, (d.conv_dim, d.conv_kernel), device, dtype, 0.5)
    return x, weight, _randn(gen, (batch, d.conv_dim, d.conv_kernel - 1), device, dtype)


def gated_norm_inputs(rows: int, d: GDNDims, dtype: torch.dtype, device: torch.device, seed: int):
    """(x, z [1, rows, HV, V], weight [V]) in `dtype`: the delta rule's output, the z gate and the norm weight."""
    gen = generator(device, seed)
    x = _randn(gen, (1, rows, d.num_v_heads, d.head_v_dim), device, dtype)
    z = _randn(gen, (1, rows, d.num_v_heads, d.head_v_dim), device, dtype)
    return x, z, (1.0 + _randn(gen, (d.head_v_dim,), device, torch.float32, 0.3)).to(dtype)


def gdn_weights(d: GDNDims, dtype: torch.dtype, device: torch.device, seed: int = 2) -> GDNWeights:
    gen = generator(device, seed)
    h = d.hidden_size
    # Rows of one tensor, as a loaded checkpoint's are: the decode layer's stacked GEMM weight is then a view.
    qkv, z, b, a = stack_rows(tuple(_randn(gen, (rows, h), device, dtype, h**-0.5)
                                    for rows in (d.conv_dim, d.value_dim, d.num_v_heads, d.num_v_heads)))
    return GDNWeights(
        in_proj_qkv=qkv,
        in_proj_z=z,
        in_proj_b=b,
        in_proj_a=a,
        conv1d=_randn(gen, (d.conv_dim, d.conv_kernel), device, dtype, 0.5),
        A_log=(torch.rand(d.num_v_heads, generator=gen, device=device) * (16 - 0.01) + 0.01).log().to(dtype),
        dt_bias=(1.0 + _randn(gen, (d.num_v_heads,), device, torch.float32, 0.5)).to(dtype),
        norm=(1.0 + _randn(gen, (d.head_v_dim,), device, torch.float32, 0.3)).to(dtype),
        out_proj=_randn(gen, (h, d.value_dim), device, dtype, d.value_dim**-0.5),
        dims=d,
    )


def gdn_hidden(batch: int, tokens: int, d: GDNDims, dtype: torch.dtype, device: torch.device, seed: int):
    return _randn(generator(device, seed), (batch, tokens, d.hidden_size), device, dtype)


def attention_weights(d: AttentionDims, dtype: torch.dtype, device: torch.device, seed: int = 3) -> AttentionWeights:
    gen = generator(device, seed)
    h, heads, kv = d.hidden_size, d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
    # Rows of one tensor, as a loaded checkpoint's are: the decode layer's stacked GEMM weight is then a view.
    q, k, v = stack_rows(tuple(_randn(gen, (rows, h), device, dtype, h**-0.5) for rows in (2 * heads, kv, kv)))
    return AttentionWeights(
        q_proj=q,
        k_proj=k,
        v_proj=v,
        o_proj=_randn(gen, (h, heads), device, dtype, heads**-0.5),
        q_norm=_randn(gen, (d.head_dim,), device, dtype, NORM_SCALE),
        k_norm=_randn(gen, (d.head_dim,), device, dtype, NORM_SCALE),
        dims=d,
    )


def rank_config(cfg: Qwen36Config, tp: int) -> Qwen36Config:
    """One rank's share of the model under vLLM's TP=`tp` sharding (model/tp), as a config of its own:
    query heads, GDN key/value heads, expert, shared-expert and dense intermediates and the (padded) vocabulary
    divided by tp; kv heads divided, or 1 where vLLM replicates them (fewer kv heads than ranks); the hidden
    size, the router (all experts on every rank), head dims and norms whole."""
    padded_vocab = -(-cfg.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    return replace(
        cfg,
        vocab_size=check_divisible(f"vocab_size padded to {padded_vocab}", padded_vocab, tp),
        num_attention_heads=check_divisible("num_attention_heads", cfg.num_attention_heads, tp),
        num_key_value_heads=len(kv_heads_for_rank(0, tp, cfg.num_key_value_heads)),
        linear_num_key_heads=check_divisible("linear_num_key_heads", cfg.linear_num_key_heads, tp),
        linear_num_value_heads=check_divisible("linear_num_value_heads", cfg.linear_num_value_heads, tp),
        moe_intermediate_size=check_divisible("moe_intermediate_size", cfg.moe_intermediate_size, tp),
        shared_expert_intermediate_size=check_divisible(
            "shared_expert_intermediate_size", cfg.shared_expert_intermediate_size, tp),
        intermediate_size=None if cfg.intermediate_size is None else check_divisible(
            "intermediate_size", cfg.intermediate_size, tp),
    )


def _dense_mlp_weights(hidden: int, inter: int, dtype, device, seed: int) -> DenseMLPWeights:
    gen = generator(device, seed)
    return DenseMLPWeights(gate_proj=_randn(gen, (inter, hidden), device, dtype, hidden**-0.5),
                           up_proj=_randn(gen, (inter, hidden), device, dtype, hidden**-0.5),
                           down_proj=_randn(gen, (hidden, inter), device, dtype, inter**-0.5))


def rank_weights(cfg: Qwen36Config, dtype: torch.dtype, device: torch.device, seed: int = 10) -> Qwen36Weights:
    """Random weights of a whole model at `cfg`'s shapes (pass `rank_config(...)` for one rank's), drawn on
    `device` layer by layer, each block from its own seed. The embedding is N(0, 1) (the first norm rescales
    it); every projection N(0, 1/fan_in), so the pre-norm residual stream grows only like sqrt(layers)."""
    h = cfg.hidden_size
    gen = generator(device, seed)
    layers = []
    for i, kind in enumerate(cfg.layer_types):
        block_seed = seed + 1000 * (i + 1)
        if kind == "linear_attention":
            mixer = gdn_weights(cfg.gdn_dims, dtype, device, block_seed)
        else:
            mixer = attention_weights(cfg.attention_dims, dtype, device, block_seed)
        if cfg.is_moe_layer(i):
            mlp = moe_weights(moe_dims_of(cfg), dtype, device, block_seed + 1)
        elif cfg.intermediate_size is None:
            raise ValueError(f"layer {i} has a dense MLP (mlp_only_layers / decoder_sparse_step) but the config "
                             "has no intermediate_size: add it to the config")
        else:
            mlp = _dense_mlp_weights(h, cfg.intermediate_size, dtype, device, block_seed + 1)
        layers.append(LayerWeights(kind=kind, mixer=mixer, mlp=mlp,
                                   input_norm=_randn(gen, (h,), device, dtype, NORM_SCALE),
                                   post_norm=_randn(gen, (h,), device, dtype, NORM_SCALE)))
    return Qwen36Weights(
        config=cfg,
        embed=_randn(gen, (cfg.vocab_size, h), device, dtype),
        layers=tuple(layers),
        final_norm=_randn(gen, (h,), device, dtype, NORM_SCALE),
        lm_head=_randn(gen, (cfg.vocab_size, h), device, dtype, h**-0.5),
    )
