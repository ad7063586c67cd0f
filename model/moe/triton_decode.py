"""Triton routed experts for small T (decode): two kernels, one program per (token, slot) pair.

Kernel 1, per pair p = (t, j) and a block of intermediate rows: act[p] = silu(gate_e x_t) * (up_e x_t), read
straight from `w13[e]` (no `w13[ids]` gather copy). Kernel 2, per token and a block of hidden columns:
out[t] = sum_j w[t, j] * down_e act[p], all top-k slots in one tile, summed inside the program (no atomics,
so the result is the same on every run). Everything accumulates in float32; the launches need no host
synchronisation, so the path can be captured in a CUDA graph.

With a shared expert (`experts_and_shared_triton_decode`, the fused MoE block of model.moe.triton_block) each
token has one more slot, k, whose gate/up rows come from the shared expert's own [Is, H] tensors; kernel 1's
programs for that slot also take x_t . shared_gate (one program per token stores it), and kernel 2 adds
sigmoid(that logit) * down_shared act[t, k] to the routed sum before the single store in x's dtype.

Reads are per pair, so an expert chosen by several tokens is read once per pair; the grid puts the pairs of
one weight block next to each other so those repeats are served from L2 (see `DECODE_CONFIGS`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..dispatch.triton_launch import jit_launch
from ..dispatch.triton_support import defined_interpreted

__all__ = [
    "DecodeConfig", "DECODE_CONFIGS", "INTERPRETED", "SharedExpert", "decode_config", "experts_and_shared_triton_decode",
    "experts_triton_decode",
]


# Row strides only: the wrappers pass tensors whose last dim is contiguous. top_k and slots (top_k, plus one with
# a shared expert) are not specialised on (their values change nothing the compiler can use), to compile fewer
# variants. SHARED_SLOT is a compile-time switch: without it the shared-expert code is not compiled at all.
@triton.jit(do_not_specialize=["top_k", "slots"])
def _gate_up_silu_kernel(
    x_ptr, w13_ptr, ids_ptr, act_ptr,
    shared_w1_ptr, shared_w3_ptr, shared_gate_ptr, gate_logit_ptr,
    top_k, slots, hidden, inter, shared_inter,
    stride_xt, stride_we, stride_wr, stride_it, stride_ik, stride_s1, stride_s3, stride_at,
    BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, SHARED_SLOT: tl.constexpr,
):
    pair = tl.program_id(0)  # fastest-varying: the pairs sharing a weight block run side by side
    block_i = tl.program_id(1)
    tok = pair // slots
    slot = pair % slots
    routed = slot < top_k
    expert = tl.load(ids_ptr + tok * stride_it + slot * stride_ik, mask=routed, other=0)
    gate_base = w13_ptr + expert * stride_we
    up_base = gate_base + inter * stride_wr  # up rows follow the gate rows
    gate_stride = stride_wr
    up_stride = stride_wr
    rows = inter
    if SHARED_SLOT:
        # The shared slot reads its own gate_proj / up_proj ([Is, H] each): a select of base and stride, not a
        # branch, so every slot runs the same loop below.
        gate_base = tl.where(routed, gate_base, shared_w1_ptr)
        up_base = tl.where(routed, up_base, shared_w3_ptr)
        gate_stride = tl.where(routed, stride_wr, stride_s1)
        up_stride = tl.where(routed, stride_wr, stride_s3)
        rows = tl.where(routed, inter, shared_inter)

    offs_i = block_i * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = offs_i < rows
    gate_rows = gate_base + offs_i[:, None] * gate_stride
    up_rows = up_base + offs_i[:, None] * up_stride
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
    tl.store(act_ptr + pair * stride_at + offs_i, act, mask=mask_i)
    if SHARED_SLOT:
        if (slot == top_k) & (block_i == 0):
            # One program per token takes the shared gate's logit x_t . shared_gate, after its own rows: inside
            # the loop above its accumulator raised every program's registers (ptxas, sm_90, T = 1: 168 -> 210).
            acc_logit = tl.zeros([BLOCK_H], dtype=tl.float32)
            for h0 in range(0, hidden, BLOCK_H):
                offs_h = h0 + tl.arange(0, BLOCK_H)
                mask_h = offs_h < hidden
                xv = tl.load(x_row + offs_h, mask=mask_h, other=0.0).to(tl.float32)
                g = tl.load(shared_gate_ptr + offs_h, mask=mask_h, other=0.0)
                acc_logit += g.to(tl.float32) * xv
            tl.store(gate_logit_ptr + tok, tl.sum(acc_logit, axis=0))


@triton.jit(do_not_specialize=["top_k", "slots"])
def _down_weighted_sum_kernel(
    act_ptr, w2_ptr, ids_ptr, weights_ptr, out_ptr,
    shared_w2_ptr, gate_logit_ptr,
    top_k, slots, hidden, inter, shared_inter,
    stride_we, stride_wh, stride_it, stride_ik, stride_rt, stride_rk, stride_ot, stride_at, stride_sh,
    BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr, TOP_K_POW2: tl.constexpr, SHARED_SLOT: tl.constexpr,
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
    act_rows = act_ptr + (tok * slots + offs_j)[:, None] * stride_at
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
    if SHARED_SLOT:
        # The shared slot, weighted by sigmoid(its gate's logit), added before the one store. A loop of its own:
        # its tile inside the routed loop made ptxas spill twice as many registers (sm_90).
        shared_act = act_ptr + (tok * slots + top_k) * stride_at
        shared_rows = shared_w2_ptr + offs_n[:, None] * stride_sh
        acc_shared = tl.zeros([BLOCK_N], dtype=tl.float32)
        for i0 in range(0, shared_inter, BLOCK_I):
            offs_i = i0 + tl.arange(0, BLOCK_I)
            mask_s = offs_i < shared_inter
            a_s = tl.load(shared_act + offs_i, mask=mask_s, other=0.0)
            w_s = tl.load(shared_rows + offs_i[None, :], mask=mask_n[:, None] & mask_s[None, :], other=0.0)
            acc_shared += tl.sum(w_s.to(tl.float32) * a_s[None, :], axis=1)
        out += tl.sigmoid(tl.load(gate_logit_ptr + tok)) * acc_shared
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


@dataclass(frozen=True)
class SharedExpert:
    """The shared expert as the kernels read it: gate_proj and up_proj [Is, H], down_proj [H, Is], gate [1, H]
    (HF's layout; every last dim contiguous, one dtype with the routed weights)."""

    w1: torch.Tensor
    w3: torch.Tensor
    w2: torch.Tensor
    gate: torch.Tensor


def experts_triton_decode(x, w13, w2, weights, ids, out, config: DecodeConfig | None = None):
    """The expert-path calling convention (model.moe.experts), for tensors whose last dim is contiguous;
    `config` overrides the per-T table."""
    return _launch(x, w13, w2, weights, ids, None, out, config)


def experts_and_shared_triton_decode(x, w13, w2, weights, ids, shared: SharedExpert, out,
                                     config: DecodeConfig | None = None, launch=jit_launch):
    """out = routed experts + sigmoid(x . shared.gate) * shared expert(x), in the same two launches. `launch`:
    how the kernels are launched (model.dispatch.triton_launch: the JIT, or a caller's prepared plan)."""
    return _launch(x, w13, w2, weights, ids, shared, out, config, launch)


def _launch(x, w13, w2, weights, ids, shared: SharedExpert | None, out, config: DecodeConfig | None,
            launch=jit_launch):
    num_tokens, top_k = ids.shape
    if num_tokens == 0:
        return out  # no programs to launch (a grid of zero is refused)
    hidden, inter = x.shape[1], w2.shape[2]
    cfg = config or decode_config(num_tokens)
    has_shared = shared is not None
    slots = top_k + int(has_shared)  # slot k is the shared expert
    shared_inter = shared.w1.shape[0] if has_shared else 0
    act_cols = max(inter, shared_inter)  # one row per (token, slot); a slot writes its first I or Is columns
    act = torch.empty((num_tokens * slots, act_cols), dtype=torch.float32, device=x.device)
    if has_shared:
        s1, s3, s2, gate = shared.w1, shared.w3, shared.w2, shared.gate
        gate_logit = torch.empty((num_tokens,), dtype=torch.float32, device=x.device)
    else:  # never read (SHARED_SLOT=False compiles the shared code out): any tensors of the right kinds
        s1, s3, s2, gate, gate_logit = w13, w13, w2, x, act
    gate_up_meta = {"BLOCK_I": cfg.block_i, "BLOCK_H": cfg.block_h, "SHARED_SLOT": has_shared,
                    "num_warps": cfg.warps_gate_up}
    launch(_gate_up_silu_kernel, (num_tokens * slots, triton.cdiv(act_cols, cfg.block_i)), gate_up_meta)(
        x, w13, ids, act,
        s1, s3, gate, gate_logit,
        top_k, slots, hidden, inter, shared_inter,
        x.stride(0), w13.stride(0), w13.stride(1), ids.stride(0), ids.stride(1), s1.stride(0), s3.stride(0),
        act.stride(0),
    )
    down_meta = {"BLOCK_N": cfg.block_n, "BLOCK_I": cfg.block_i_down, "num_warps": cfg.warps_down,
                 "TOP_K_POW2": max(8, triton.next_power_of_2(top_k)),  # one compiled variant for every k up to 8
                 "SHARED_SLOT": has_shared}
    launch(_down_weighted_sum_kernel, (num_tokens, triton.cdiv(hidden, cfg.block_n)), down_meta)(
        act, w2, ids, weights, out,
        s2, gate_logit,
        top_k, slots, hidden, inter, shared_inter,
        w2.stride(0), w2.stride(1), ids.stride(0), ids.stride(1), weights.stride(0), weights.stride(1), out.stride(0),
        act.stride(0), s2.stride(0),
    )
    return out
