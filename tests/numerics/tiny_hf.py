"""Tiny random HF checkpoints of both layouts, built deterministically from a seed (nothing is downloaded).

Both use transformers' own classes (Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM) with eager attention and
eager experts, so the cross-check compares against code nobody here wrote. HF initialises norm weights to
exactly 0 (zero-centred) or 1 (gated) and dt_bias to 1; `_randomise_` perturbs every parameter so a
mistaken `w` vs `1 + w` or a dropped dt_bias cannot hide.
"""
from __future__ import annotations

from pathlib import Path

import torch

# Small but every ratio of the real model kept: 3 GDN : 1 attention, HV = 2H, GQA 2:1, partial RoPE 1/4,
# top-k < experts, shared expert; head dims of 16/32 so chunking, l2norm and RoPE are non-trivial.
TINY_DIMS = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    initializer_range=0.08,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

LAYOUTS = ("qwen3_5", "qwen3_next")


def _config(layout: str):
    common = dict(TINY_DIMS, attn_implementation="eager", experts_implementation="eager")
    if layout == "qwen3_5":
        from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig

        return Qwen3_5MoeTextConfig(**common)
    if layout == "qwen3_next":
        from transformers import Qwen3NextConfig

        return Qwen3NextConfig(**common, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    raise ValueError(f"layout={layout!r}: choose one of {LAYOUTS}")


def _model_class(layout: str):
    if layout == "qwen3_5":
        from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM

        return Qwen3_5MoeForCausalLM
    from transformers import Qwen3NextForCausalLM

    return Qwen3NextForCausalLM


@torch.no_grad()
def _randomise_(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if name.endswith("linear_attn.norm.weight"):
            p.copy_(1.0 + 0.3 * noise)  # gated norm: plain weight around 1
        elif name.endswith("norm.weight"):
            p.copy_(0.3 * noise)  # zero-centred norms: weight around 0, used as 1 + w
        elif name.endswith("dt_bias"):
            p.copy_(1.0 + 0.5 * noise)
        elif name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(0.01, 16, generator=gen).log())


def build_tiny_hf_model(layout: str, seed: int = 0):
    """A tiny float32 HF causal LM of `layout`, the same for the same seed."""
    torch.manual_seed(seed)
    model = _model_class(layout)(_config(layout)).float().eval()
    _randomise_(model, seed)
    return model


def save_tiny_checkpoint(layout: str, directory: Path, seed: int = 0):
    """Write the tiny model as an HF checkpoint (config.json + safetensors); returns the HF model."""
    model = build_tiny_hf_model(layout, seed)
    model.save_pretrained(str(directory), safe_serialization=True)
    return model
