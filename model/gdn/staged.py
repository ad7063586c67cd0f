"""The GDN layer as a chain of per-block paths, one block after another (several kernels each):

    qkv = conv(x @ in_proj_qkv^T);  z = x @ in_proj_z^T;  b = x @ in_proj_b^T;  a = x @ in_proj_a^T
    g = -exp(A_log) * softplus(a + dt_bias)   (float32);   beta = sigmoid(b)
    o = delta_rule(q, k, v, g, beta; state);  y = out_proj(gated_rms_norm(o, z))

with the serving choice of each block's path (the device's dispatch table for the conv, the rule and the gated
norm, else each block's default). `gdn_layer` (model.gdn.layer) runs it for prefills, and the decode layer's
`staged` and `reference` paths (model.gdn.decode_layer) run it for one token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dispatch.scope import scoped
from ..dispatch.table import served_path
from ..norm.rms_norm import GATED_NORM_PATHS, compute_dtype
from .conv import CONV_PATHS, run_conv_path
from .rule import GDN_RULE_PATHS, run_gdn_rule

__all__ = ["gdn_gating", "select_conv_path", "select_gated_norm_path", "select_rule_path", "staged_core", "staged_layer"]


def gdn_gating(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) in float32 (float64 for float64 input): g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).

    softplus uses torch's threshold 20 (x itself above it), as the vLLM kernels do.
    """
    ct = compute_dtype(a.dtype)
    g = -A_log.to(ct).exp() * F.softplus(a.to(ct) + dt_bias.to(ct))
    return g, torch.sigmoid(b.to(ct))


@scoped
def select_rule_path(
    num_tokens: int,
    batch: int = 1,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> str:
    """The serving choice. Given the call's device and dtype, the device's dispatch table decides where it has
    a runnable entry (`gdn_decode` by batch for one token, `gdn_prefill` by token count otherwise); else the
    vectorised step for one token and the chunked form for a prefill."""
    block, key = ("gdn_decode", batch) if num_tokens == 1 else ("gdn_prefill", num_tokens)
    default = "decode_step" if num_tokens == 1 else "chunked"
    return served_path(GDN_RULE_PATHS, block, key, num_tokens, device, dtype, default)


@scoped
def select_conv_path(
    num_tokens: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> str:
    """The serving choice. Given the call's device and dtype, the device's dispatch table decides where it has
    a runnable entry (`gdn_conv`, by tokens per sequence); else the window shift for one token and the grouped
    conv1d for a prefill."""
    default = "update" if num_tokens == 1 else "prefill"
    return served_path(CONV_PATHS, "gdn_conv", num_tokens, num_tokens, device, dtype, default)


@scoped
def select_gated_norm_path(
    rows: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> str:
    """The serving choice for the layer's gated RMSNorm over `rows` tokens (B * T: the norm does not care which
    sequence a row is of). Given the call's device and dtype, the device's dispatch table decides where it has a
    runnable entry (`gdn_gated_norm`); else `fused`."""
    return served_path(GATED_NORM_PATHS, "gdn_gated_norm", rows, rows, device, dtype, "fused")


def staged_layer(
    x: torch.Tensor,
    w,
    conv_state: torch.Tensor,
    recurrent: torch.Tensor,
    *,
    rule: str | None,
    conv: str | None,
    norm: str | None,
    final_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y [B, T, hidden] in x's dtype, the conv state and the recurrent state after the last token) for
    x [B, T, hidden] and the weights `w` (a GDNWeights). `rule` / `conv` / `norm` None: the serving choice.
    `final_state`: where the rule path writes the recurrent state (None: a new tensor in its state dtype);
    it must not overlap `recurrent`. Neither input state is modified."""
    d = w.dims
    batch, tokens, _ = x.shape
    z = F.linear(x, w.in_proj_z).reshape(batch, tokens, d.num_v_heads, d.head_v_dim)
    normed, conv_state, recurrent = staged_core(
        F.linear(x, w.in_proj_qkv), z, F.linear(x, w.in_proj_b), F.linear(x, w.in_proj_a), w, conv_state, recurrent,
        rule=rule, conv=conv, norm=norm, final_state=final_state)
    y = F.linear(normed.reshape(batch, tokens, d.value_dim), w.out_proj)
    return y, conv_state, recurrent


def staged_core(
    qkv: torch.Tensor,
    z: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    w,
    conv_state: torch.Tensor,
    recurrent: torch.Tensor,
    *,
    rule: str | None,
    conv: str | None,
    norm: str | None,
    final_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer between its input projections and out_proj: (normed [B, T, HV, V] in qkv's dtype, the conv state
    and the recurrent state after the last token) for the projected qkv [B, T, conv_dim], z [B, T, HV, V] and
    b, a [B, T, HV]. `w` needs only conv1d, A_log, dt_bias, norm and dims (a GDNWeights, or a server's layer's
    own tensors: patches/model_paths/served_gdn.py). Arguments as staged_layer's."""
    d = w.dims
    batch, tokens, _ = qkv.shape
    conv = conv or select_conv_path(tokens, qkv.device, qkv.dtype)
    mixed, conv_state = run_conv_path(conv, qkv, w.conv1d, conv_state)
    q, k, v = mixed.split([d.key_dim, d.key_dim, d.value_dim], dim=-1)
    q = q.reshape(batch, tokens, d.num_k_heads, d.head_k_dim)
    k = k.reshape(batch, tokens, d.num_k_heads, d.head_k_dim)
    v = v.reshape(batch, tokens, d.num_v_heads, d.head_v_dim)
    g, beta = gdn_gating(a, b, w.A_log, w.dt_bias)
    rule = rule or select_rule_path(tokens, batch, qkv.device, v.dtype)
    core, recurrent = run_gdn_rule(rule, q, k, v, g, beta, recurrent, final_state=final_state)
    norm = norm or select_gated_norm_path(batch * tokens, qkv.device, qkv.dtype)
    return GATED_NORM_PATHS[norm].fn(core.to(qkv.dtype), w.norm, d.eps, z), conv_state, recurrent
