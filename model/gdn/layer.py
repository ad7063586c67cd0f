"""The Gated DeltaNet layer of Qwen3.5/3.6: projections, short conv, gating, the delta rule, gated norm,
out_proj, with the per-sequence state (conv window + recurrent state) handed from call to call.

    qkv = conv(x @ in_proj_qkv^T);  z = x @ in_proj_z^T;  b = x @ in_proj_b^T;  a = x @ in_proj_a^T
    g = -exp(A_log) * softplus(a + dt_bias)   (float32);   beta = sigmoid(b)
    o = delta_rule(q, k, v, g, beta; state);  y = out_proj(gated_rms_norm(o, z))

A prefill runs the blocks one after another (model.gdn.staged); a decode step (one token) runs a whole-layer
path of model.gdn.decode_layer. The weights and state live in model.gdn.weights.
"""
from __future__ import annotations

import torch

from .decode_layer import run_decode_layer, select_decode_layer_path
from .staged import gdn_gating, select_conv_path, select_gated_norm_path, select_rule_path, staged_layer
from .weights import GDNState, GDNWeights

__all__ = ["GDNWeights", "GDNState", "gdn_gating", "gdn_layer", "select_rule_path", "select_conv_path",
           "select_gated_norm_path", "served_decode_layer"]


def served_decode_layer(
    batch: int,
    device: torch.device | str,
    dtype: torch.dtype,
    *,
    rule: str | None = None,
    conv: str | None = None,
    norm: str | None = None,
    decode_layer: str | None = None,
) -> str | None:
    """The whole-layer path (GDN_DECODE_LAYER_PATHS) a one-token gdn_layer call runs with these arguments, or
    None when a forced rule, conv or norm path keeps it on the staged blocks with those paths."""
    if rule is not None or conv is not None or norm is not None:
        return None
    return decode_layer or select_decode_layer_path(batch, device, dtype)


def gdn_layer(
    x: torch.Tensor,
    w: GDNWeights,
    state: GDNState | None = None,
    *,
    rule: str | None = None,
    conv: str | None = None,
    norm: str | None = None,
    decode_layer: str | None = None,
    in_place: bool = False,
) -> tuple[torch.Tensor, GDNState]:
    """y [B, T, hidden] in x's dtype and the state after the last token. `state=None` starts a sequence.

    `rule` / `conv` / `norm` force a block's registered path (default: the serving choice, `select_rule_path`,
    `select_conv_path`, `select_gated_norm_path`: the device's dispatch table, else each block's default).
    One token with none of them forced runs a whole-layer path of GDN_DECODE_LAYER_PATHS: `decode_layer`, or
    `select_decode_layer_path` (the device's dispatch table, else `staged`, the blocks one after another).
    The input state is never modified, unless `in_place`: then the returned state is `state` itself,
    overwritten (a capturable decode step keeps its state buffers).
    """
    if x.dim() != 3 or x.shape[-1] != w.dims.hidden_size:
        raise ValueError(f"GDN input has shape {tuple(x.shape)}; expected [B, T, {w.dims.hidden_size}]")
    batch, tokens, _ = x.shape
    if state is None:
        state = GDNState.zeros(batch, w.dims, x.dtype, x.device)
    name = served_decode_layer(batch, x.device, x.dtype, rule=rule, conv=conv, norm=norm,
                               decode_layer=decode_layer) if tokens == 1 else None
    if name is not None:
        out_state = state if in_place else state.empty_like()
        return run_decode_layer(name, x, w, state, out_state), out_state
    if decode_layer is not None:
        raise ValueError(
            f"decode_layer={decode_layer!r} replaces the whole layer for one token; it cannot combine with "
            f"T={tokens} or a forced rule/conv/norm path (rule={rule!r}, conv={conv!r}, norm={norm!r})"
        )
    y, conv_state, recurrent = staged_layer(x, w, state.conv, state.recurrent, rule=rule, conv=conv, norm=norm)
    new_state = GDNState(conv=conv_state, recurrent=recurrent.to(state.recurrent.dtype))
    return y, (state.copy_(new_state) if in_place else new_state)
