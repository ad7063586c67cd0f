"""The middle of the GDN decode layer (T == 1) in one Triton kernel: everything between the input GEMM and out_proj.

Eagerly, the staged decode layer is ~20 launches at tens of microseconds of host time each, for a few hundred
kilobytes of data. Here one launch takes the stacked projection row of each sequence
[q | k | v | z | b | a] (x @ model.gdn.GDNWeights.in_proj_stacked^T) and, on chip:

    conv:    window [state (W-1 columns), new input] -> depthwise conv -> SiLU on the q, k, v channels;
             the window's last W-1 columns are the new conv state
    gating:  g = -exp(A_log) * softplus(a + dt_bias)  (torch's threshold 20),  beta = sigmoid(b)
    rule:    q <- l2norm(q) * K^-0.5,  k <- l2norm(k),  S <- exp(g) S,  S <- S + k (beta (v - k^T S))^T,  o = S^T q
    norm:    w * o * rsqrt(mean(o^2) + eps) * silu(z)

writing the new conv and recurrent states and the normed output [B, HV*V] in the activation dtype. Everything
is float32 on chip: the conv output and o are not rounded to the activation dtype on the way (the staged layer
rounds both), so the result is closer to the float64 reference than the staged layer's and not bit-equal to it.

Grid: one program per (sequence, key head), looping over the HV/H value heads that read the key head. Each
conv-state and recurrent-state element then belongs to exactly one program, so the new state may overwrite the
old one in place (a capturable decode step): one program per value head would have the HV/H programs of a key
head all read the shared q/k conv window while one of them overwrites it. Inside a program, a barrier separates
every thread's reads of a state element from the writes that replace it. At B = 1 that is H programs (4 at
the per-rank dims), each moving 2 x 64 KB of recurrent state: the launch, not the data, is the cost there.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..dispatch import triton_support
from ..dispatch.triton_launch import LaunchPlan, PlansByOwner
from ..dispatch.triton_support import defined_interpreted
from .rule import L2NORM_EPS

__all__ = ["INTERPRETED", "fused_decode_core", "unavailable_reason"]

_LOW_PRECISION = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _conv_window(proj_row, state_row, s_c, s_w, w_ptr, w_c, w_w, channels, mask, W: tl.constexpr, BW: tl.constexpr):
    """(window [C, BW] float32: columns 0..W-2 the conv state, W-1 the new input; silu(conv) [C])."""
    taps = tl.arange(0, BW)
    window = tl.load(state_row + channels[:, None] * s_c + taps[None, :] * s_w,
                     mask=mask[:, None] & (taps < W - 1)[None, :], other=0.0).to(tl.float32)
    new = tl.load(proj_row + channels, mask=mask, other=0.0).to(tl.float32)
    window = tl.where((taps == W - 1)[None, :], new[:, None], window)
    weight = tl.load(w_ptr + channels[:, None] * w_c + taps[None, :] * w_w,
                     mask=mask[:, None] & (taps < W)[None, :], other=0.0).to(tl.float32)
    y = tl.sum(window * weight, axis=1)
    return window, y * tl.sigmoid(y)


@triton.jit
def _store_shifted(window, state_row, s_c, s_w, channels, mask, W: tl.constexpr, BW: tl.constexpr):
    """The new conv state: the window's columns 1..W-1 into state columns 0..W-2."""
    taps = tl.arange(0, BW)
    keep = (taps >= 1) & (taps < W)
    tl.store(state_row + channels[:, None] * s_c + (taps[None, :] - 1) * s_w,
             window.to(state_row.dtype.element_ty), mask=mask[:, None] & keep[None, :])


@triton.jit
def _softplus(x):
    """torch's softplus (x above the threshold 20); log1p(e) as log(1 + e) * e / ((1 + e) - 1), which keeps
    float32's relative precision for small e where log(1 + e) alone would lose it."""
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    log1p = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def _gdn_decode_kernel(
    proj_ptr, conv_w_ptr, a_log_ptr, dt_bias_ptr, norm_w_ptr,
    conv_in_ptr, conv_out_ptr, rec_in_ptr, rec_out_ptr, out_ptr, state_rows_ptr,
    stride_p, sci_b, sci_c, sci_w, sco_b, sco_c, sco_w, stride_wc, stride_ww,
    sri_b, sri_h, sri_k, sri_v, sro_b, sro_h, sro_k, sro_v, stride_o,
    q_scale, eps,
    NUM_K_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_K: tl.constexpr, HEAD_V: tl.constexpr,
    W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BW: tl.constexpr, L2_EPS: tl.constexpr,
    INDEXED: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)  # int64: b * stride cannot overflow at large batches
    h = tl.program_id(1)
    if INDEXED:  # sequence b's state is row state_rows[b] of a cache (a server's slots), updated there
        sb = tl.load(state_rows_ptr + b).to(tl.int64)
    else:
        sb = b
    key_dim = NUM_K_HEADS * HEAD_K
    num_v_heads = NUM_K_HEADS * GROUP
    value_dim = num_v_heads * HEAD_V
    conv_dim = 2 * key_dim + value_dim
    proj_row = proj_ptr + b * stride_p
    conv_in, conv_out = conv_in_ptr + sb * sci_b, conv_out_ptr + sb * sco_b
    offs_k, offs_v = tl.arange(0, BK), tl.arange(0, BV)
    mask_k, mask_v = offs_k < HEAD_K, offs_v < HEAD_V
    mask_kv = mask_k[:, None] & mask_v[None, :]

    # q and k of this key head: conv, then l2norm (q also scaled by K^-0.5).
    q_ch, k_ch = h * HEAD_K + offs_k, key_dim + h * HEAD_K + offs_k
    q_win, q = _conv_window(proj_row, conv_in, sci_c, sci_w, conv_w_ptr, stride_wc, stride_ww, q_ch, mask_k, W, BW)
    k_win, k = _conv_window(proj_row, conv_in, sci_c, sci_w, conv_w_ptr, stride_wc, stride_ww, k_ch, mask_k, W, BW)
    tl.debug_barrier()  # every read of the old q/k windows before any write (conv_out may be conv_in)
    _store_shifted(q_win, conv_out, sco_c, sco_w, q_ch, mask_k, W, BW)
    _store_shifted(k_win, conv_out, sco_c, sco_w, k_ch, mask_k, W, BW)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + L2_EPS) * q_scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + L2_EPS)

    for j in tl.static_range(GROUP):  # the value heads that read key head h
        hv = h * GROUP + j
        v_ch = 2 * key_dim + hv * HEAD_V + offs_v
        v_win, v = _conv_window(proj_row, conv_in, sci_c, sci_w, conv_w_ptr, stride_wc, stride_ww, v_ch, mask_v, W, BW)
        state = tl.load(rec_in_ptr + sb * sri_b + hv * sri_h + offs_k[:, None] * sri_k + offs_v[None, :] * sri_v,
                        mask=mask_kv, other=0.0)
        tl.debug_barrier()  # every read of the old v window and state before any write (in place)
        _store_shifted(v_win, conv_out, sco_c, sco_w, v_ch, mask_v, W, BW)

        a = tl.load(proj_row + conv_dim + value_dim + num_v_heads + hv).to(tl.float32)
        beta = tl.sigmoid(tl.load(proj_row + conv_dim + value_dim + hv).to(tl.float32))
        a_log = tl.load(a_log_ptr + hv).to(tl.float32)
        g = -tl.exp(a_log) * _softplus(a + tl.load(dt_bias_ptr + hv).to(tl.float32))

        state = state * tl.exp(g)
        delta = beta * (v - tl.sum(state * k[:, None], axis=0))
        state = state + k[:, None] * delta[None, :]
        o = tl.sum(state * q[:, None], axis=0)
        tl.store(rec_out_ptr + sb * sro_b + hv * sro_h + offs_k[:, None] * sro_k + offs_v[None, :] * sro_v,
                 state, mask=mask_kv)

        z = tl.load(proj_row + conv_dim + hv * HEAD_V + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        w = tl.load(norm_w_ptr + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        normed = w * o * tl.rsqrt(tl.sum(o * o, axis=0) / HEAD_V + eps) * (z * tl.sigmoid(z))
        tl.store(out_ptr + b * stride_o + hv * HEAD_V + offs_v, normed.to(out_ptr.dtype.element_ty), mask=mask_v)


# Whether TRITON_INTERPRET=1 was set when the kernel was defined: then it runs on CPU tensors only.
INTERPRETED = defined_interpreted(_gdn_decode_kernel)


def unavailable_reason(device: torch.device) -> str | None:
    return triton_support.unavailable_reason(device, INTERPRETED)


@functools.cache
def _tile(head_k: int, head_v: int, kernel: int) -> tuple[int, int, int, int]:
    """(BK, BV, BW, num_warps), cached: triton.next_power_of_2 costs microseconds of host time a call.
    A [BK, BV] float32 state tile over num_warps warps: 64 elements a thread at the real 128 x 128."""
    bk, bv, bw = (triton.next_power_of_2(n) for n in (head_k, head_v, kernel))
    return bk, bv, bw, min(8, max(1, bk * bv // 2048))


def _check(proj: torch.Tensor, w, state, out_state) -> None:
    # Cheap attribute reads only (every eager decode step runs this).
    if proj.dtype not in _LOW_PRECISION:
        raise TypeError(f"the fused GDN decode kernel takes {_LOW_PRECISION}, not {proj.dtype}; use the 'staged' path")
    if proj.is_cuda == INTERPRETED:
        raise ValueError(f"the fused GDN decode kernel cannot run on {proj.device}: {unavailable_reason(proj.device)}")
    for what, t in (("state", state.recurrent), ("out_state", out_state.recurrent)):
        if t.dtype != torch.float32:
            raise TypeError(f"the fused GDN decode kernel keeps the recurrent state in float32; {what} is {t.dtype}")
    for what, t in (("A_log", w.A_log), ("dt_bias", w.dt_bias), ("norm", w.norm)):
        if t.stride(0) != 1:  # the kernel indexes these vectors without a stride
            raise ValueError(f"the fused GDN decode kernel reads {what} as a contiguous vector; its stride is {t.stride(0)}")


# Per weights object: one launch plan per call shape (model.dispatch.triton_launch), so an eager decode step pays the
# JIT's argument binding once per shape rather than on every call.
_PLANS = PlansByOwner()


def fused_decode_core(proj: torch.Tensor, w, state, out_state, rows: torch.Tensor | None = None) -> torch.Tensor:
    """normed [B, HV*V] in proj's dtype from proj [B, conv_dim + value_dim + 2*HV] (= x @ w.in_proj_stacked^T),
    the weights `w` (GDNWeights) and `state` (GDNState); writes the state after the token into `out_state`,
    which may be `state` itself. `rows` (int32 or int64 [B]): the states are caches of any number of rows and
    sequence b's is row rows[b] (a server's state slots, advanced in place without a gather and a scatter); rows
    must be distinct. Shapes are the caller's to check (model.gdn.decode_layer)."""
    ci, co, ri, ro = state.conv, out_state.conv, state.recurrent, out_state.recurrent
    # Everything the kernel specialises on that can change between calls with one weights object (the weights'
    # own layout is fixed; `normed` is a fresh allocation, always aligned).
    key = (proj.shape, proj.dtype, proj.device, proj.stride(), proj.data_ptr() % 16,
           None if rows is None else (rows.dtype, rows.data_ptr() % 16),
           *((t.dtype, t.stride(), t.data_ptr() % 16) for t in (ci, co, ri, ro)))
    plans = _PLANS.of(w)
    plan = plans.get(key)
    if plan is None:
        _check(proj, w, state, out_state)
        plan = plans[key] = LaunchPlan()
    d = w.dims
    batch = proj.shape[0]
    normed = torch.empty(batch, d.value_dim, dtype=proj.dtype, device=proj.device)
    if batch == 0:
        return normed
    bk, bv, bw, num_warps = _tile(d.head_k_dim, d.head_v_dim, d.conv_kernel)
    meta = {"NUM_K_HEADS": d.num_k_heads, "GROUP": d.group, "HEAD_K": d.head_k_dim, "HEAD_V": d.head_v_dim,
            "W": d.conv_kernel, "BK": bk, "BV": bv, "BW": bw, "L2_EPS": L2NORM_EPS, "INDEXED": rows is not None,
            "num_warps": num_warps}
    plan(_gdn_decode_kernel, (batch, d.num_k_heads), meta)(
        proj, w.conv1d, w.A_log, w.dt_bias, w.norm, ci, co, ri, ro, normed, proj if rows is None else rows,
        proj.stride(0), *ci.stride(), *co.stride(), *w.conv1d.stride(), *ri.stride(), *ro.stride(), normed.stride(0),
        d.head_k_dim ** -0.5, d.eps,
    )
    return normed
