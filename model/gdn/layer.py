"""The Gated DeltaNet layer of Qwen3.5/3.6: projections, short conv, gating, the delta rule, gated norm,
out_proj, with the per-sequence state (conv window + recurrent state) handed from call to call.

    qkv = conv(x @ in_proj_qkv^T);  z = x @ in_proj_z^T;  b = x @ in_proj_b^T;  a = x @ in_proj_a^T
    g = -exp(A_log) * softplus(a + dt_bias)   (float32);   beta = sigmoid(b)
    o = delta_rule(q, k, v, g, beta; state);  y = out_proj(gated_rms_norm(o, z))
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

import torch
import torch.nn.functional as F

from ..dispatch_table import table_path_for
from ..norm import GATED_NORM_PATHS, compute_dtype
from .conv import run_conv_path, zero_conv_state
from .layout import GDNDims, qwen35_to_qwen3_next, qwen3_next_to_qwen35
from .rule import GDN_RULE_PATHS, run_gdn_rule

__all__ = ["GDNWeights", "GDNState", "gdn_gating", "gdn_layer", "select_rule_path", "select_conv_path"]

# Layout -> the HF keys (under a layer's `linear_attn.` prefix) that identify it.
LAYOUT_KEYS = {
    "qwen3_5": ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"),
    "qwen3_next": ("in_proj_qkvz.weight", "in_proj_ba.weight"),
}
COMMON_KEYS = ("conv1d.weight", "A_log", "dt_bias", "norm.weight", "out_proj.weight")


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
        return replace(self, **{k: v.to(device=device, dtype=dtype) for k, v in self.tensors().items()})

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

    @classmethod
    def zeros(cls, batch: int, dims: GDNDims, dtype: torch.dtype, device=None) -> "GDNState":
        return cls(
            conv=zero_conv_state(batch, dims.conv_dim, dims.conv_kernel, dtype, device),
            recurrent=torch.zeros(
                batch, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim, dtype=compute_dtype(dtype), device=device
            ),
        )


def gdn_gating(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) in float32 (float64 for float64 input): g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).

    softplus uses torch's threshold 20 (x itself above it), as the vLLM kernels do.
    """
    ct = compute_dtype(a.dtype)
    g = -A_log.to(ct).exp() * F.softplus(a.to(ct) + dt_bias.to(ct))
    return g, torch.sigmoid(b.to(ct))


def select_rule_path(
    num_tokens: int,
    batch: int = 1,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> str:
    """The serving choice. Given the call's device and dtype, the device's dispatch table decides where it has
    a runnable entry (`gdn_decode` by batch for one token, `gdn_prefill` by token count otherwise); else the
    vectorised step for one token and the chunked form for a prefill."""
    if device is not None and dtype is not None:
        block, key = ("gdn_decode", batch) if num_tokens == 1 else ("gdn_prefill", num_tokens)
        measured = table_path_for(
            block, key, device, dtype,
            lambda name: GDN_RULE_PATHS.can_run(name, num_tokens, dtype, device),
        )
        if measured is not None:
            return measured
    return "decode_step" if num_tokens == 1 else "chunked"


def select_conv_path(num_tokens: int) -> str:
    return "update" if num_tokens == 1 else "prefill"


def gdn_layer(
    x: torch.Tensor,
    w: GDNWeights,
    state: GDNState | None = None,
    *,
    rule: str | None = None,
    conv: str | None = None,
    norm: str = "fused",
) -> tuple[torch.Tensor, GDNState]:
    """y [B, T, hidden] in x's dtype and the state after the last token. `state=None` starts a sequence.

    `rule` / `conv` force a registered path (default: `select_rule_path`, as in serving).
    """
    if x.dim() != 3 or x.shape[-1] != w.dims.hidden_size:
        raise ValueError(f"GDN input has shape {tuple(x.shape)}; expected [B, T, {w.dims.hidden_size}]")
    d = w.dims
    batch, tokens, _ = x.shape
    if state is None:
        state = GDNState.zeros(batch, d, x.dtype, x.device)
    mixed, conv_state = run_conv_path(
        conv or select_conv_path(tokens), F.linear(x, w.in_proj_qkv), w.conv1d, state.conv
    )
    q, k, v = mixed.split([d.key_dim, d.key_dim, d.value_dim], dim=-1)
    q = q.reshape(batch, tokens, d.num_k_heads, d.head_k_dim)
    k = k.reshape(batch, tokens, d.num_k_heads, d.head_k_dim)
    v = v.reshape(batch, tokens, d.num_v_heads, d.head_v_dim)
    g, beta = gdn_gating(F.linear(x, w.in_proj_a), F.linear(x, w.in_proj_b), w.A_log, w.dt_bias)
    rule = rule or select_rule_path(tokens, batch, x.device, v.dtype)
    core, recurrent = run_gdn_rule(rule, q, k, v, g, beta, state.recurrent)
    z = F.linear(x, w.in_proj_z).reshape(batch, tokens, d.num_v_heads, d.head_v_dim)
    normed = GATED_NORM_PATHS[norm].fn(core.to(x.dtype), w.norm, d.eps, z)
    y = F.linear(normed.reshape(batch, tokens, d.value_dim), w.out_proj)
    return y, GDNState(conv=conv_state, recurrent=recurrent.to(state.recurrent.dtype))
