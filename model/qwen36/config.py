"""The text model's configuration, read once from an HF config (Qwen3.5/3.6-MoE or Qwen3-Next)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..attention.layer import AttentionDims
from ..attention.rope import rotary_dim_for
from ..gdn import GDNDims

__all__ = ["Qwen36Config", "ConfigError", "LAYER_KINDS"]

LAYER_KINDS = ("linear_attention", "full_attention")
SUPPORTED_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")


class ConfigError(ValueError):
    """An HF config this model cannot run; the message names the field and what to do."""


@dataclass(frozen=True)
class Qwen36Config:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    rms_norm_eps: float
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    tie_word_embeddings: bool = False
    intermediate_size: int | None = None  # dense MLP layers (Qwen3-Next `mlp_only_layers`)
    mlp_only_layers: tuple[int, ...] = ()
    decoder_sparse_step: int = 1

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_types)} entries for num_hidden_layers={self.num_hidden_layers}"
            )
        unknown = sorted(set(self.layer_types) - set(LAYER_KINDS))
        if unknown:
            raise ConfigError(f"layer_types contains {unknown}; supported kinds are {LAYER_KINDS}")

    @property
    def attention_dims(self) -> AttentionDims:
        return AttentionDims(
            hidden_size=self.hidden_size,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rotary_dim=rotary_dim_for(self.head_dim, self.partial_rotary_factor),
            rope_theta=self.rope_theta,
            eps=self.rms_norm_eps,
        )

    @property
    def gdn_dims(self) -> GDNDims:
        return GDNDims(
            hidden_size=self.hidden_size,
            num_k_heads=self.linear_num_key_heads,
            num_v_heads=self.linear_num_value_heads,
            head_k_dim=self.linear_key_head_dim,
            head_v_dim=self.linear_value_head_dim,
            conv_kernel=self.linear_conv_kernel_dim,
            eps=self.rms_norm_eps,
        )

    def is_moe_layer(self, index: int) -> bool:
        """HF's rule: sparse unless listed in mlp_only_layers or off the decoder_sparse_step grid."""
        return (
            index not in self.mlp_only_layers
            and self.num_experts > 0
            and (index + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> "Qwen36Config":
        """From a config.json dict; a multimodal Qwen3.5 config contributes its `text_config`."""
        top = dict(raw)
        model_type = top.get("model_type", "")
        d = dict(top["text_config"]) if "text_config" in top else top
        model_type = d.get("model_type", model_type)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"model_type={model_type!r} is not one of {SUPPORTED_MODEL_TYPES}")
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act={d['hidden_act']!r}: only silu is implemented")
        if not d.get("norm_topk_prob", True):
            raise ConfigError("norm_topk_prob=False: model.moe routers always renormalise the top-k weights")
        if d.get("attention_bias", False):
            raise ConfigError("attention_bias=True: Qwen3.5/3.6 attention has no bias; this model does not load one")
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", "mrope"):
            raise ConfigError(f"rope_type={rope.get('rope_type')!r}: only default (NeoX) RoPE is implemented")
        layers = d["num_hidden_layers"]
        layer_types = d.get("layer_types") or [
            "full_attention" if (i + 1) % d.get("full_attention_interval", 4) == 0 else "linear_attention"
            for i in range(layers)
        ]
        hidden, heads = d["hidden_size"], d["num_attention_heads"]
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=hidden,
            num_hidden_layers=layers,
            layer_types=tuple(layer_types),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            num_attention_heads=heads,
            num_key_value_heads=d["num_key_value_heads"],
            head_dim=d.get("head_dim") or hidden // heads,
            rope_theta=rope.get("rope_theta", d.get("rope_theta", 10000.0)),
            partial_rotary_factor=rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.25)),
            linear_num_key_heads=d["linear_num_key_heads"],
            linear_num_value_heads=d["linear_num_value_heads"],
            linear_key_head_dim=d["linear_key_head_dim"],
            linear_value_head_dim=d["linear_value_head_dim"],
            linear_conv_kernel_dim=d.get("linear_conv_kernel_dim", 4),
            num_experts=d["num_experts"],
            num_experts_per_tok=d["num_experts_per_tok"],
            moe_intermediate_size=d["moe_intermediate_size"],
            shared_expert_intermediate_size=d["shared_expert_intermediate_size"],
            tie_word_embeddings=bool(top.get("tie_word_embeddings", d.get("tie_word_embeddings", False))),
            intermediate_size=d.get("intermediate_size"),
            mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
            decoder_sparse_step=d.get("decoder_sparse_step", 1),
        )

    @classmethod
    def from_pretrained_dir(cls, path: str | Path) -> "Qwen36Config":
        config_path = Path(path) / "config.json"
        if not config_path.is_file():
            raise ConfigError(f"{config_path} does not exist: pass an HF checkpoint directory with a config.json")
        return cls.from_hf_dict(json.loads(config_path.read_text()))
