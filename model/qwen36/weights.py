"""All weights of the text model, read from an HF state dict in the Qwen3.5/3.6-MoE or Qwen3-Next layout."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Union

import torch

from ..attention.layer import AttentionWeights
from ..gdn import GDNWeights
from ..moe import MoEWeights
from .config import Qwen36Config

__all__ = [
    "DenseMLPWeights",
    "LayerWeights",
    "Qwen36Weights",
    "load_safetensors_dir",
    "text_prefix",
]

# Prefixes of the text model's weights: causal-LM checkpoints, then multimodal (ConditionalGeneration) ones.
TEXT_PREFIXES = ("model.", "model.language_model.")


@dataclass(frozen=True)
class DenseMLPWeights:
    """A dense SwiGLU MLP (Qwen3-Next layers in `mlp_only_layers`)."""

    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor

    def to(self, dtype=None, device=None) -> "DenseMLPWeights":
        return DenseMLPWeights(*(t.to(device=device, dtype=dtype) for t in (self.gate_proj, self.up_proj, self.down_proj)))


@dataclass(frozen=True)
class LayerWeights:
    kind: str  # "linear_attention" | "full_attention"
    mixer: Union[GDNWeights, AttentionWeights]
    mlp: Union[MoEWeights, DenseMLPWeights]
    input_norm: torch.Tensor  # zero-centred
    post_norm: torch.Tensor  # zero-centred

    def to(self, dtype=None, device=None) -> "LayerWeights":
        return replace(
            self,
            mixer=self.mixer.to(dtype=dtype, device=device),
            mlp=self.mlp.to(dtype=dtype, device=device),
            input_norm=self.input_norm.to(device=device, dtype=dtype),
            post_norm=self.post_norm.to(device=device, dtype=dtype),
        )


def text_prefix(state: Mapping[str, torch.Tensor]) -> str:
    for prefix in TEXT_PREFIXES:
        if prefix + "embed_tokens.weight" in state:
            return prefix
    raise KeyError(
        f"no embed_tokens.weight under any of {TEXT_PREFIXES}: is this a Qwen3.5/3.6 or Qwen3-Next text checkpoint?"
    )


def _take(state: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    try:
        return state[key]
    except KeyError:
        raise KeyError(f"checkpoint lacks {key!r}") from None


@dataclass(frozen=True)
class Qwen36Weights:
    config: Qwen36Config
    embed: torch.Tensor  # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # [vocab, hidden]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def to(self, dtype=None, device=None) -> "Qwen36Weights":
        return replace(
            self,
            embed=self.embed.to(device=device, dtype=dtype),
            layers=tuple(layer.to(dtype=dtype, device=device) for layer in self.layers),
            final_norm=self.final_norm.to(device=device, dtype=dtype),
            lm_head=self.lm_head.to(device=device, dtype=dtype),
        )

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor], config: Qwen36Config) -> "Qwen36Weights":
        prefix = text_prefix(state)
        layers = []
        for i, kind in enumerate(config.layer_types):
            lp = f"{prefix}layers.{i}."
            if kind == "linear_attention":
                mixer = GDNWeights.from_hf_state_dict(state, config.gdn_dims, prefix=lp + "linear_attn.")
            else:
                mixer = AttentionWeights.from_hf_state_dict(state, config.attention_dims, prefix=lp + "self_attn.")
            if config.is_moe_layer(i):
                mp = lp + "mlp."
                mlp = MoEWeights.from_hf_state_dict(state, top_k=config.num_experts_per_tok, prefix=mp)
            else:
                mlp = DenseMLPWeights(*(_take(state, f"{lp}mlp.{p}.weight") for p in ("gate_proj", "up_proj", "down_proj")))
            layers.append(
                LayerWeights(
                    kind=kind,
                    mixer=mixer,
                    mlp=mlp,
                    input_norm=_take(state, lp + "input_layernorm.weight"),
                    post_norm=_take(state, lp + "post_attention_layernorm.weight"),
                )
            )
        embed = _take(state, prefix + "embed_tokens.weight")
        if "lm_head.weight" in state:
            lm_head = state["lm_head.weight"]
        elif config.tie_word_embeddings:
            lm_head = embed
        else:
            raise KeyError("checkpoint lacks 'lm_head.weight' and tie_word_embeddings is false")
        return cls(config, embed, tuple(layers), _take(state, prefix + "norm.weight"), lm_head)

    @classmethod
    def from_pretrained_dir(cls, path: str | Path, dtype: torch.dtype | None = None) -> "Qwen36Weights":
        config = Qwen36Config.from_pretrained_dir(path)
        weights = cls.from_state_dict(load_safetensors_dir(path), config)
        return weights if dtype is None else weights.to(dtype=dtype)


def load_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in an HF checkpoint directory (vision and MTP weights too)."""
    from safetensors.torch import load_file  # an HF dependency; imported here so `model` imports stay light

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}: save the checkpoint with safe_serialization")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
