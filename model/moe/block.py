"""The sparse MoE block of Qwen3.5/3.6: router + routed experts + sigmoid-gated shared expert.

    out = experts(x, route(x @ router.T)) + sigmoid(x @ shared_gate.T) * shared_expert(x)

Weights use the HF Qwen3.5 names and layout (`MoEWeights.from_hf_state_dict` reads a block's state dict).
Here: the weights, the shared expert and the float64 definition; `moe_block` (model.moe.block_paths) runs one of
the block's registered paths.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

import torch
import torch.nn.functional as F

from .experts import experts_reference
from .router import route_reference

__all__ = ["MoEWeights", "fuse_per_expert_weights", "shared_expert", "moe_block_reference", "MOE_HF_NAMES"]

# MoEWeights field -> key in an HF Qwen3_5MoeSparseMoeBlock / Qwen3NextSparseMoeBlock state dict.
MOE_HF_NAMES = {
    "router": "gate.weight",
    "w13": "experts.gate_up_proj",
    "w2": "experts.down_proj",
    "shared_w1": "shared_expert.gate_proj.weight",
    "shared_w3": "shared_expert.up_proj.weight",
    "shared_w2": "shared_expert.down_proj.weight",
    "shared_gate": "shared_expert_gate.weight",
}


@dataclass(frozen=True)
class MoEWeights:
    router: torch.Tensor  # [E, H]
    w13: torch.Tensor  # [E, 2I, H], gate rows then up rows
    w2: torch.Tensor  # [E, H, I]
    shared_w1: torch.Tensor  # [Is, H] gate_proj
    shared_w3: torch.Tensor  # [Is, H] up_proj
    shared_w2: torch.Tensor  # [H, Is] down_proj
    shared_gate: torch.Tensor  # [1, H]
    top_k: int

    def __post_init__(self) -> None:
        num_experts, two_i, hidden = self.w13.shape
        expected = {
            "router": (num_experts, hidden),
            "w2": (num_experts, hidden, two_i // 2),
            "shared_w3": tuple(self.shared_w1.shape),
            "shared_w2": (hidden, self.shared_w1.shape[0]),
            "shared_gate": (1, hidden),
        }
        for name, shape in expected.items():
            actual = tuple(getattr(self, name).shape)
            if actual != shape:
                raise ValueError(f"MoEWeights.{name} has shape {actual}; expected {shape} from w13 {tuple(self.w13.shape)}")
        if two_i % 2:
            raise ValueError(f"w13 has {two_i} rows: gate_up_proj needs an even number (gate then up)")
        if not 1 <= self.top_k <= num_experts:
            raise ValueError(f"top_k={self.top_k} must be between 1 and num_experts={num_experts}")

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def intermediate_size(self) -> int:
        return self.w2.shape[2]

    @property
    def shared_intermediate_size(self) -> int:
        return self.shared_w1.shape[0]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "top_k"}

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> "MoEWeights":
        return replace(self, **{k: v.to(device=device, dtype=dtype) for k, v in self.tensors().items()})

    @classmethod
    def from_hf_state_dict(cls, state: Mapping[str, torch.Tensor], top_k: int, prefix: str = "") -> "MoEWeights":
        """Read a block's weights: the fused in-memory layout of transformers (`experts.gate_up_proj`), or the
        per-expert keys (`experts.{e}.gate_proj.weight` ...) that checkpoints store on disk."""
        if prefix + MOE_HF_NAMES["w13"] not in state and prefix + MOE_HF_NAMES["router"] in state:
            num_experts = state[prefix + MOE_HF_NAMES["router"]].shape[0]
            state = {**state, **fuse_per_expert_weights(state, prefix, num_experts)}
        missing = [prefix + key for key in MOE_HF_NAMES.values() if prefix + key not in state]
        if missing:
            raise KeyError(f"MoE block state dict lacks {missing}; is {prefix!r} the right prefix?")
        return cls(top_k=top_k, **{name: state[prefix + key] for name, key in MOE_HF_NAMES.items()})

    def to_hf_state_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        return {prefix + key: getattr(self, name) for name, key in MOE_HF_NAMES.items()}


def fuse_per_expert_weights(state: Mapping[str, torch.Tensor], prefix: str, num_experts: int) -> dict[str, torch.Tensor]:
    """The fused `experts.gate_up_proj` [E, 2I, H] (gate rows first) and `experts.down_proj` [E, H, I] of an
    MoE block from the per-expert `experts.{e}.{gate,up,down}_proj.weight` keys that HF checkpoints store
    on disk (transformers fuses them at load time and splits them again in `save_pretrained`)."""

    def per_expert(proj: str) -> list[torch.Tensor]:
        keys = [f"{prefix}experts.{e}.{proj}.weight" for e in range(num_experts)]
        missing = [k for k in keys if k not in state]
        if missing:
            raise KeyError(f"MoE block state dict lacks {missing[:3]}{' ...' if len(missing) > 3 else ''}")
        return [state[k] for k in keys]

    gate, up, down = per_expert("gate_proj"), per_expert("up_proj"), per_expert("down_proj")
    return {
        prefix + MOE_HF_NAMES["w13"]: torch.stack([torch.cat([g, u], dim=0) for g, u in zip(gate, up)]),
        prefix + MOE_HF_NAMES["w2"]: torch.stack(down),
    }


def shared_expert(x: torch.Tensor, w: MoEWeights) -> torch.Tensor:
    """sigmoid(shared_gate(x)) * down(silu(gate(x)) * up(x)), in x's dtype."""
    h = F.silu(F.linear(x, w.shared_w1)) * F.linear(x, w.shared_w3)
    return torch.sigmoid(F.linear(x, w.shared_gate)) * F.linear(h, w.shared_w2)


def moe_block_reference(
    x: torch.Tensor,
    w: MoEWeights,
    routing: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The definition in float64. Routing comes from float64 logits unless `routing` gives a decision.

    Pass the routing of the implementation under test (the same low-precision logits through
    `route_reference`) so that a near-tie decided differently by rounding is not counted as an error.
    """
    x64, w64 = x.double(), w.to(torch.float64)
    weights, ids = route_reference(F.linear(x64, w64.router), w.top_k) if routing is None else routing
    out = torch.empty(x.shape, dtype=torch.float64, device=x.device)
    experts_reference(x64, w64.w13, w64.w2, weights, ids, out)
    return out + shared_expert(x64, w64)
