"""The GDN layer's data: its weights (`GDNWeights`, Qwen3.5 layout, either HF layout on load) and the per-sequence
state it hands from call to call (`GDNState`: conv window + recurrent state).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Mapping

import torch

from ..norm.rms_norm import compute_dtype
from ..rows import moved_keeping_rows, stack_rows, stacked_rows
from .conv import zero_conv_state
from .layout import GDNDims, qwen35_to_qwen3_next, qwen3_next_to_qwen35

__all__ = ["GDNState", "GDNWeights", "stack_rows", "stacked_rows"]

# Layout -> the HF keys (under a layer's `linear_attn.` prefix) that identify it.
LAYOUT_KEYS = {
    "qwen3_5": ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"),
    "qwen3_next": ("in_proj_qkvz.weight", "in_proj_ba.weight"),
}
COMMON_KEYS = ("conv1d.weight", "A_log", "dt_bias", "norm.weight", "out_proj.weight")
# The four input projections in the order the decode layer's single GEMM stacks them.
PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")


@dataclass(frozen=True)
class GDNWeights:
    """One GDN layer's weights in the Qwen3.5 layout (the Qwen3-Next layout converts on load)."""

    in_proj_qkv: torch.Tensor  # [2*H*K + HV*V, hidden]
    in_proj_z: torch.Tensor  # [HV*V, hidden]
    in_proj_b: torch.Tensor  # [HV, hidden]
    in_proj_a: torch.Tensor  # [HV, hidden]
    conv1d: torch.Tensor  # [conv_dim, W] (HF stores [conv_dim, 1, W])
    A_log: torch.Tensor  # [HV]
    dt_bias: torch.Tensor  # [HV]
    norm: torch.Tensor  # [V], plain weight (init ones)
    out_proj: torch.Tensor  # [hidden, HV*V]
    dims: GDNDims

    def __post_init__(self) -> None:
        d = self.dims
        expected = {
            "in_proj_qkv": (d.conv_dim, d.hidden_size),
            "in_proj_z": (d.value_dim, d.hidden_size),
            "in_proj_b": (d.num_v_heads, d.hidden_size),
            "in_proj_a": (d.num_v_heads, d.hidden_size),
            "conv1d": (d.conv_dim, d.conv_kernel),
            "A_log": (d.num_v_heads,),
            "dt_bias": (d.num_v_heads,),
            "norm": (d.head_v_dim,),
            "out_proj": (d.hidden_size, d.value_dim),
        }
        for name, shape in expected.items():
            actual = tuple(getattr(self, name).shape)
            if actual != shape:
                raise ValueError(f"GDNWeights.{name} has shape {actual}; expected {shape} for {d}")

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "dims"}

    def to(self, dtype: torch.dtype | None = None, device=None) -> "GDNWeights":
        # The four projections moved as one tensor when they are rows of one (see in_proj_stacked).
        return replace(self, **moved_keeping_rows(self.tensors(), PROJECTIONS, dtype, device))

    @functools.cached_property
    def in_proj_stacked(self) -> torch.Tensor:
        """[in_proj_qkv; in_proj_z; in_proj_b; in_proj_a], [conv_dim + value_dim + 2*HV, hidden]: the decode
        layer's one input GEMM. Memory: none when the four are consecutive rows of one tensor, as
        `from_hf_state_dict` and `to` leave them (a view). Otherwise they are concatenated on first use and the
        copy is kept on this object (not seen by later in-place edits of the four): a second copy of the
        projections, (2048 + 1024 + 16) * 2048 * 2 bytes = 12.6 MB per GDN layer in bf16 at the per-rank dims
        of Qwen3.6 under TP=4, 0.38 GB over its 30 GDN layers."""
        projections = tuple(getattr(self, name) for name in PROJECTIONS)
        stacked = stacked_rows(projections)
        return torch.cat(projections) if stacked is None else stacked

    @staticmethod
    def detect_layout(state: Mapping[str, torch.Tensor], prefix: str = "") -> str:
        for layout, keys in LAYOUT_KEYS.items():
            if all(prefix + key in state for key in keys):
                return layout
        raise KeyError(
            f"no GDN projection weights under {prefix!r}: expected {LAYOUT_KEYS['qwen3_5']} (Qwen3.5) "
            f"or {LAYOUT_KEYS['qwen3_next']} (Qwen3-Next); is the prefix right?"
        )

    @classmethod
    def from_hf_state_dict(cls, state: Mapping[str, torch.Tensor], dims: GDNDims, prefix: str = "") -> "GDNWeights":
        """Read a `linear_attn` module's state dict in either layout (detected from the keys)."""
        layout = cls.detect_layout(state, prefix)
        missing = [prefix + key for key in COMMON_KEYS if prefix + key not in state]
        if missing:
            raise KeyError(f"GDN state dict lacks {missing}")
        if layout == "qwen3_next":
            qkv, z, b, a = qwen3_next_to_qwen35(state[prefix + "in_proj_qkvz.weight"], state[prefix + "in_proj_ba.weight"], dims)
        else:
            qkv, z, b, a = (state[prefix + key] for key in LAYOUT_KEYS["qwen3_5"])
        # One tensor holds the four (a second copy of the projections only while `state` lives), so the decode
        # layer's stacked GEMM weight is a view of it and costs no memory (in_proj_stacked).
        qkv, z, b, a = stack_rows((qkv, z, b, a))
        conv = state[prefix + "conv1d.weight"]
        return cls(
            in_proj_qkv=qkv,
            in_proj_z=z,
            in_proj_b=b,
            in_proj_a=a,
            conv1d=conv.reshape(conv.shape[0], conv.shape[-1]),
            A_log=state[prefix + "A_log"],
            dt_bias=state[prefix + "dt_bias"],
            norm=state[prefix + "norm.weight"],
            out_proj=state[prefix + "out_proj.weight"],
            dims=dims,
        )

    def to_hf_state_dict(self, prefix: str = "", layout: str = "qwen3_5") -> dict[str, torch.Tensor]:
        if layout == "qwen3_5":
            proj = dict(zip(LAYOUT_KEYS["qwen3_5"], (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)))
        elif layout == "qwen3_next":
            qkvz, ba = qwen35_to_qwen3_next(self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a, self.dims)
            proj = {"in_proj_qkvz.weight": qkvz, "in_proj_ba.weight": ba}
        else:
            raise ValueError(f"layout={layout!r}: choose 'qwen3_5' or 'qwen3_next'")
        common = {
            "conv1d.weight": self.conv1d.unsqueeze(1),
            "A_log": self.A_log,
            "dt_bias": self.dt_bias,
            "norm.weight": self.norm,
            "out_proj.weight": self.out_proj,
        }
        return {prefix + k: v for k, v in {**proj, **common}.items()}


@dataclass(frozen=True)
class GDNState:
    """One sequence batch's GDN state: conv window [B, conv_dim, W-1] (activation dtype) and recurrent
    state [B, HV, K, V] (float32; float64 in a float64 run)."""

    conv: torch.Tensor
    recurrent: torch.Tensor

    def empty_like(self) -> "GDNState":
        """Uninitialised buffers of this state's shapes, dtypes and device (for a path's `out_state`)."""
        return GDNState(conv=torch.empty_like(self.conv), recurrent=torch.empty_like(self.recurrent))

    def copy_(self, other: "GDNState") -> "GDNState":
        """Overwrite this state with `other` (casting to this state's dtypes); returns self."""
        self.conv.copy_(other.conv)
        self.recurrent.copy_(other.recurrent)
        return self

    @classmethod
    def zeros(cls, batch: int, dims: GDNDims, dtype: torch.dtype, device=None) -> "GDNState":
        return cls(
            conv=zero_conv_state(batch, dims.conv_dim, dims.conv_kernel, dtype, device),
            recurrent=torch.zeros(
                batch, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim, dtype=compute_dtype(dtype), device=device
            ),
        )
