"""The GDN layer end to end and stage by stage (projections, causal conv1d, gating, delta rule, gated RMSNorm,
out_proj), to say which part dominates once the rule is fast; at the decode points, every fused decode-layer
path (model.gdn.GDN_DECODE_LAYER_PATHS) end to end beside it. The whole layer's output is compared with the
float64 layer built from the reference paths; model/tolerances.py bounds it only in float32
(GDN_LAYER), so for other dtypes the error is reported, not judged."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from model.gdn import GDN_DECODE_LAYER_PATHS, GDNDims, GDNState, gdn_gating, gdn_layer, run_conv_path, run_gdn_rule
from model.norm.rms_norm import GATED_NORM_PATHS

from model import tolerances
from ..measure.inputs import gdn_hidden, gdn_weights, generator
from ..measure.point import Measurement, Settings, check_error, measure
from ..table.block_rows import fused_layer_paths, is_layer_row

__all__ = ["time_gdn_layer", "LAYER_POINTS"]

# (batch, tokens): a long and a longest prefill, the smallest and largest decode batch.
LAYER_POINTS = ((1, 4096), (1, 16384), (1, 1), (256, 1))
STAGES = ("in_proj", "conv", "gating", "rule", "gated_norm", "out_proj", "layer")
Choice = Callable[[int, int], str]  # (batch, tokens) -> a block's path name


def _random_state(batch: int, d: GDNDims, dtype: torch.dtype, device: torch.device, seed: int) -> GDNState:
    gen = generator(device, seed)
    conv = torch.randn((batch, d.conv_dim, d.conv_kernel - 1), generator=gen, device=device).to(dtype)
    rec = 0.5 * torch.randn((batch, d.num_v_heads, d.head_k_dim, d.head_v_dim), generator=gen, device=device)
    return GDNState(conv=conv, recurrent=rec)


def _stage_calls(x, w, state, rule: str, conv_path: str, norm: str) -> dict[str, Callable[[], object]]:
    """One closure per stage over inputs computed once by the stages before it (as gdn_layer computes them)."""
    d = w.dims
    batch, tokens, _ = x.shape
    qkv = F.linear(x, w.in_proj_qkv)
    mixed, _ = run_conv_path(conv_path, qkv, w.conv1d, state.conv)
    q, k, v = mixed.split([d.key_dim, d.key_dim, d.value_dim], dim=-1)
    q = q.reshape(batch, tokens, d.num_k_heads, d.head_k_dim)
    k = k.reshape(batch, tokens, d.num_k_heads, d.head_k_dim)
    v = v.reshape(batch, tokens, d.num_v_heads, d.head_v_dim)
    a, b = F.linear(x, w.in_proj_a), F.linear(x, w.in_proj_b)
    g, beta = gdn_gating(a, b, w.A_log, w.dt_bias)
    core, _ = run_gdn_rule(rule, q, k, v, g, beta, state.recurrent)
    z = F.linear(x, w.in_proj_z).reshape(batch, tokens, d.num_v_heads, d.head_v_dim)
    normed = GATED_NORM_PATHS[norm].fn(core.to(x.dtype), w.norm, d.eps, z)
    flat = normed.reshape(batch, tokens, d.value_dim)
    return {
        "in_proj": lambda: [F.linear(x, m) for m in (w.in_proj_qkv, w.in_proj_z, w.in_proj_a, w.in_proj_b)],
        "conv": lambda: run_conv_path(conv_path, qkv, w.conv1d, state.conv),
        "gating": lambda: gdn_gating(a, b, w.A_log, w.dt_bias),
        "rule": lambda: run_gdn_rule(rule, q, k, v, g, beta, state.recurrent),
        "gated_norm": lambda: GATED_NORM_PATHS[norm].fn(core.to(x.dtype), w.norm, d.eps, z),
        "out_proj": lambda: F.linear(flat, w.out_proj),
    }


def _fused_layer_calls(x, w, state, names) -> dict[str, Callable[[], object]]:
    """One closure per fused decode-layer path: the whole layer, into a fresh state (the input state is kept, so
    every call does the same work)."""
    out_state = GDNState(conv=torch.empty_like(state.conv), recurrent=torch.empty_like(state.recurrent))
    return {name: (lambda fn=GDN_DECODE_LAYER_PATHS[name].fn: (fn(x, w, state, out_state),)) for name in names}


def time_gdn_layer(d: GDNDims, s: Settings, rule_for: Choice, tick: Callable[[str], None],
                   points=LAYER_POINTS, rows: list[Measurement] | None = None,
                   stages: tuple[str, ...] | None = None, conv_for: Choice | None = None,
                   norm_for: Choice | None = None) -> list[Measurement]:
    """Appends to `rows` as it goes (a sweep stopped half way keeps what it measured); `stages` picks what is
    timed (default: every stage of the staged layer, the whole staged layer `layer`, and every fused decode-layer
    path at the decode points; the perf gate times only whole layers). The staged layer runs `rule_for`'s rule
    path, and `conv_for`'s conv and `norm_for`'s gated norm where given, else the layer's serving choice of
    them; timing a single stage needs both given."""
    fused = fused_layer_paths()
    stages = (*STAGES, *fused) if stages is None else stages
    w = gdn_weights(d, s.dtype, s.device)
    w64 = w.to(torch.float64)
    bound = tolerances.GDN_LAYER.get(s.dtype)
    rows = [] if rows is None else rows
    for batch, tokens in points:
        tick(f"gdn layer B={batch} T={tokens}")
        block = "gdn_layer_decode" if tokens == 1 else "gdn_layer_prefill"
        key = batch if tokens == 1 else tokens
        rule = rule_for(batch, tokens)
        x = gdn_hidden(batch, tokens, d, s.dtype, s.device, seed=70_000 + batch + tokens)
        state = _random_state(batch, d, s.dtype, s.device, seed=80_000 + batch + tokens)
        state64 = GDNState(conv=state.conv.double(), recurrent=state.recurrent.double())
        ref, _ = gdn_layer(x.double(), w64, state64, rule="recurrent_reference", conv="reference", norm="reference")
        del state64
        conv, norm = (conv_for(batch, tokens) if conv_for else None), (norm_for(batch, tokens) if norm_for else None)
        # Only the choices given are passed, so a reference `model` from before the conv and norm were
        # dispatched (`qwen36 tune --ab`) times its own layer as it serves it.
        forced = {k: v for k, v in (("conv", conv), ("norm", norm)) if v is not None}
        calls = {"layer": lambda: gdn_layer(x, w, state, rule=rule, **forced)}  # a forced rule: the staged layer
        if set(stages) & set(STAGES[:-1]):
            if conv is None or norm is None:
                raise ValueError("timing the GDN layer's stages needs its conv and norm choices (conv_for, norm_for)")
            calls = {**_stage_calls(x, w, state, rule, conv, norm), **calls}
        if tokens == 1:
            calls.update(_fused_layer_calls(x, w, state, [n for n in fused if n in stages and
                                                            GDN_DECODE_LAYER_PATHS[n].supports(1, s.dtype, s.device)]))
        for stage, call in calls.items():
            if stage not in stages:
                continue
            extra = {"batch": batch, "tokens": tokens} | ({"rule": rule, **forced} if stage in STAGES else {})
            m = Measurement(block, key, stage, "error", extra=extra)
            if is_layer_row(block, stage):
                m.bound = bound if bound is not None else float("inf")
                y = torch.empty(x.shape, dtype=s.dtype, device=s.device)  # static, so a graph replay fills it
                measure(m, lambda call=call, y=y: y.copy_(call()[0]), lambda y=y: y.fill_(float("nan")),
                        lambda y=y: (check_error(y, ref), ""), s)
                if bound is None and m.status == "ok":
                    m.detail = f"no {s.dtype} layer bound in tolerances.GDN_LAYER: error reported, not judged"
            else:
                m.bound = float("inf")  # stages are timed only; the layer row carries the check
                measure(m, call, lambda: None, lambda: (0.0, ""), s)
            rows.append(m)
    return rows
