"""Triton routed experts for small T (decode): two kernels, one program per (token, expert) pair.

Kernel 1, per pair p = (t, j) and a block of intermediate rows: act[p] = silu(gate_e x_t) * (up_e x_t), read
straight from `w13[e]` (no `w13[ids]` gather copy). Kernel 2, per token and a block of hidden columns:
out[t] = sum_j w[t, j] * down_e act[p], all top-k slots in one tile, summed inside the program (no atomics,
so the result is the same on every run). Everything accumulates in float32; the launches need no host
synchronisation, so the path can be captured in a CUDA graph.

Reads are per pair, so an expert chosen by several tokens is read once per pair; the grid puts the pairs of
one weight block next to each other so those repeats are served from L2 (see `DECODE_CONFIGS`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..triton_support import defined_interpreted

__all__ = ["DecodeConfig", "DECODE_CONFIGS", "INTERPRETED", "decode_config", "experts_triton_decode"]


# Row strides only: the wrapper (model.moe.expert_paths.triton_paths) passes tensors whose last dim is contiguous.
# top_k is not specialised on (its value changes nothing the compiler can use), to compile fewer variants.
@triton.jit(do_not_specialize=["top_k"])
def _gate_up_silu_kernel(
    x_ptr, w13_ptr, ids_ptr, act_ptr,
    top_k, hidden, inter,
    stride_xt, stride_we, stride_wr, stride_it, stride_ik,
    BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr,
):
    pair = tl.program_id(0)  # fastest-varying: the pairs sharing a weight block run side by side
    block_i = tl.program_id(1)
    tok = pair // top_k
    expert = tl.load(ids_ptr + tok * stride_it + (pair % top_k) * stride_ik)

    offs_i = block_i * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = offs_i < inter
    gate_rows = w13_ptr + expert * stride_we + offs_i[:, None] * stride_wr
    up_rows = gate_rows + inter * stride_wr  # up rows follow the gate rows
    x_row = x_ptr + tok * stride_xt

    # Partial products stay 2-D and are reduced once after the loop: one reduction instead of one per step.
    acc_gate = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
    for h0 in range(0, hidden, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask_h = offs_h < hidden
        xv = tl.load(x_row + offs_h, mask=mask_h, other=0.0).to(tl.float32)
        mask_w = mask_i[:, None] & mask_h[None, :]
        wg = tl.load(gate_rows + offs_h[None, :], mask=mask_w, other=0.0)
        wu = tl.load(up_rows + offs_h[None, :], mask=mask_w, other=0.0)
        acc_gate += wg.to(tl.float32) * xv[None, :]
        acc_up += wu.to(tl.float32) * xv[None, :]
    gate = tl.sum(acc_gate, axis=1)
    up = tl.sum(acc_up, axis=1)
    act = gate * tl.sigmoid(gate) * up
    tl.store(act_ptr + pair * inter + offs_i, act, mask=mask_i)


@triton.jit(do_not_specialize=["top_k"])
def _down_weighted_sum_kernel(
    act_ptr, w2_ptr, ids_ptr, weights_ptr, out_ptr,
    top_k, hidden, inter,
    stride_we, stride_wh, stride_it, stride_ik, stride_rt, stride_rk, stride_ot,
    BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr, TOP_K_POW2: tl.constexpr,
):
    tok = tl.program_id(0)  # fastest-varying: tokens sharing an expert read its block close together
    block_n = tl.program_id(1)
    offs_n = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden
    # All top-k slots at once, as one [k, BLOCK_N, BLOCK_I] tile: their weight reads are in flight together
    # instead of one round trip to memory per slot. Padding slots load zeros and add exact zeros.
    offs_j = tl.arange(0, TOP_K_POW2)
    mask_j = offs_j < top_k
    experts = tl.load(ids_ptr + tok * stride_it + offs_j * stride_ik, mask=mask_j, other=0)
    slot_weights = tl.load(weights_ptr + tok * stride_rt + offs_j * stride_rk, mask=mask_j, other=0.0)
    act_rows = act_ptr + (tok * top_k + offs_j)[:, None] * inter
    w_rows = w2_ptr + experts[:, None, None] * stride_we + offs_n[None, :, None] * stride_wh

    acc = tl.zeros([TOP_K_POW2, BLOCK_N], dtype=tl.float32)
    for i0 in range(0, inter, BLOCK_I):
        offs_i = i0 + tl.arange(0, BLOCK_I)
        mask_i = offs_i < inter
        a = tl.load(act_rows + offs_i[None, :], mask=mask_j[:, None] & mask_i[None, :], other=0.0)
        mask_w = mask_j[:, None, None] & mask_n[None, :, None] & mask_i[None, None, :]
        w = tl.load(w_rows + offs_i[None, None, :], mask=mask_w, other=0.0)
        acc += tl.sum(w.to(tl.float32) * a[:, None, :], axis=2)
    out = tl.sum(acc * slot_weights.to(tl.float32)[:, None], axis=0)
    tl.store(out_ptr + tok * stride_ot + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


@dataclass(frozen=True)
class DecodeConfig:
    """Block sizes and warps of the two kernels (defaults: the H200's best for 4 <= T <= 64)."""

    block_i: int = 8  # intermediate rows per gate-up program
    block_h: int = 512  # hidden columns per gate-up loop step
    warps_gate_up: int = 4
    block_n: int = 8  # hidden outputs per down program
    block_i_down: int = 128  # intermediate columns per down loop step
    warps_down: int = 4


# By largest T served: the H200 sweep's winners (graph replay, L2 flushed; reports/moe-triton-2026-12-01/);
# T = 1 and T = 2 had winners of their own. Re-measure with `qwen36 tune moe --sweep-configs` (docs/tuning.md).
DECODE_CONFIGS: tuple[tuple[int, DecodeConfig], ...] = (
    (1, DecodeConfig(block_i=2, block_h=2048, warps_gate_up=4, block_n=16, warps_down=8)),
    (2, DecodeConfig(block_i=8, block_h=1024, warps_gate_up=8, block_n=8, warps_down=4)),
    (1 << 30, DecodeConfig()),
)


# Triton's CPU interpreter runs each program as Python calls: few, large programs keep the CI tests quick,
# while blocks smaller than the test dims still exercise every loop and mask.
INTERPRETER_CONFIG = DecodeConfig(block_i=16, block_h=32, block_n=64, block_i_down=16)

# Whether TRITON_INTERPRET=1 was set when these kernels were defined: then they run on CPU tensors only.
INTERPRETED = defined_interpreted(_gate_up_silu_kernel)


def decode_config(num_tokens: int) -> DecodeConfig:
    if INTERPRETED:
        return INTERPRETER_CONFIG
    for max_tokens, config in DECODE_CONFIGS:
        if num_tokens <= max_tokens:
            return config
    return DECODE_CONFIGS[-1][1]


def experts_triton_decode(x, w13, w2, weights, ids, out, config: DecodeConfig | None = None):
    """The expert-path calling convention (model.moe.experts), for tensors whose last dim is contiguous;
    `config` overrides the per-T table."""
    num_tokens, top_k = ids.shape
    hidden, inter = x.shape[1], w2.shape[2]
    cfg = config or decode_config(num_tokens)
    act = torch.empty((num_tokens * top_k, inter), dtype=torch.float32, device=x.device)
    _gate_up_silu_kernel[(num_tokens * top_k, triton.cdiv(inter, cfg.block_i))](
        x, w13, ids, act,
        top_k, hidden, inter,
        x.stride(0), w13.stride(0), w13.stride(1), ids.stride(0), ids.stride(1),
        BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, num_warps=cfg.warps_gate_up,
    )
    _down_weighted_sum_kernel[(num_tokens, triton.cdiv(hidden, cfg.block_n))](
        act, w2, ids, weights, out,
        top_k, hidden, inter,
        w2.stride(0), w2.stride(1), ids.stride(0), ids.stride(1), weights.stride(0), weights.stride(1), out.stride(0),
        BLOCK_N=cfg.block_n, BLOCK_I=cfg.block_i_down, num_warps=cfg.warps_down,
        TOP_K_POW2=max(8, triton.next_power_of_2(top_k)),  # one compiled variant for every k up to 8
    )
    return out

