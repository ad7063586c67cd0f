"""Triton routed experts for large T (prefill): (token, expert) pairs grouped by expert on the device, then a
grouped GEMM per projection.

1. Group, with no host synchronisation (so the path can be captured in a CUDA graph):
   - `_count_kernel`: each pair takes its rank within its expert with an atomic add on the expert's counter;
   - `_offsets_kernel` (one program): each expert's first slot in the sorted pair list, and the running
     count of row blocks (`BLOCK_M` rows, never shared by two experts);
   - `_scatter_kernel`: sorted[first slot of e + rank] = pair.
   The atomics make the order within an expert vary between runs, but each output row depends only on its
   own pair, so the result does not.
2. `_grouped_gate_up_kernel`: per row block of one expert, x rows gathered in place, times `w13[e]`, with
   SiLU-mul; act is written in sorted order, in x's dtype.
3. `_grouped_down_kernel`: act rows times `w2[e]`, each row written to its pair's row of `y [T*k, H]`.
4. `_weighted_sum_kernel`: out[t] = sum_j w[t, j] * y[t*k + j], in float32.

Steps 2-4 use as many programs as the worst case needs (a fixed grid, no host read of the counts); programs
past the last row block return at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..dispatch.triton_support import defined_interpreted

__all__ = ["GroupedConfig", "GROUPED_CONFIGS", "INTERPRETED", "grouped_config", "experts_triton_grouped"]

_NO_EXPERT: tl.constexpr = tl.constexpr(1 << 30)  # block_end of lanes past the last expert: above any block


# The GEMMs take row strides only: the wrapper (model.moe.expert_paths.triton_paths) passes tensors whose last dim is
# contiguous. Counts that change nothing the compiler can use are not specialised on (fewer variants).
@triton.jit(do_not_specialize=["num_pairs", "top_k"])
def _count_kernel(ids_ptr, counts_ptr, rank_ptr, num_pairs, top_k, stride_it, stride_ik, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_pairs
    expert = tl.load(ids_ptr + (offs // top_k) * stride_it + (offs % top_k) * stride_ik, mask=mask, other=0)
    rank = tl.atomic_add(counts_ptr + expert, 1, mask=mask, sem="relaxed")
    tl.store(rank_ptr + offs, rank, mask=mask)


@triton.jit(do_not_specialize=["num_experts"])
def _offsets_kernel(counts_ptr, pair_start_ptr, block_end_ptr, num_experts,
                    BLOCK_M: tl.constexpr, EXPERTS_POW2: tl.constexpr):
    offs = tl.arange(0, EXPERTS_POW2)
    mask = offs < num_experts
    counts = tl.load(counts_ptr + offs, mask=mask, other=0)
    tl.store(pair_start_ptr + offs, tl.cumsum(counts, axis=0) - counts, mask=mask)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    tl.store(block_end_ptr + offs, tl.cumsum(blocks, axis=0), mask=mask)


@triton.jit(do_not_specialize=["num_pairs", "top_k"])
def _scatter_kernel(ids_ptr, rank_ptr, pair_start_ptr, sorted_ptr, num_pairs, top_k, stride_it, stride_ik,
                    BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_pairs
    expert = tl.load(ids_ptr + (offs // top_k) * stride_it + (offs % top_k) * stride_ik, mask=mask, other=0)
    rank = tl.load(rank_ptr + offs, mask=mask, other=0)
    start = tl.load(pair_start_ptr + expert, mask=mask, other=0)
    tl.store(sorted_ptr + start + rank, offs, mask=mask)


@triton.jit
def _row_block(block, counts_ptr, pair_start_ptr, block_end_ptr, num_experts,
               BLOCK_M: tl.constexpr, EXPERTS_POW2: tl.constexpr):
    """(expert, its rows of this block as sorted-list slots, which of them are real pairs)."""
    offs_e = tl.arange(0, EXPERTS_POW2)
    block_end = tl.load(block_end_ptr + offs_e, mask=offs_e < num_experts, other=_NO_EXPERT)
    # The block belongs to the first expert whose blocks end after it; empty experts end where the last did.
    expert = tl.sum((block_end <= block).to(tl.int32), axis=0)
    expert_c = tl.minimum(expert, num_experts - 1)  # keep the loads in bounds for programs past the end
    count = tl.load(counts_ptr + expert_c)
    first_block = tl.load(block_end_ptr + expert_c) - (count + BLOCK_M - 1) // BLOCK_M
    rows = (block - first_block) * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = rows < tl.where(expert < num_experts, count, 0)
    slots = tl.load(pair_start_ptr + expert_c) + rows
    return expert_c, slots, valid


@triton.jit(do_not_specialize=["num_experts", "top_k"])
def _grouped_gate_up_kernel(
    x_ptr, w13_ptr, sorted_ptr, counts_ptr, pair_start_ptr, block_end_ptr, act_ptr,
    num_experts, top_k, hidden, inter,
    stride_xt, stride_we, stride_wr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EXPERTS_POW2: tl.constexpr, IEEE_FP32: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    block = tl.program_id(0)  # fastest-varying: an expert's blocks run together and share w13[e] in L2
    block_n = tl.program_id(1)
    expert, slots, valid = _row_block(block, counts_ptr, pair_start_ptr, block_end_ptr, num_experts,
                                      BLOCK_M, EXPERTS_POW2)
    if tl.max(valid.to(tl.int32), axis=0) == 0:
        return
    pairs = tl.load(sorted_ptr + slots, mask=valid, other=0)
    x_rows = x_ptr + (pairs // top_k)[:, None] * stride_xt

    offs_n = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < inter
    gate_cols = w13_ptr + expert * stride_we + offs_n[None, :] * stride_wr
    up_cols = gate_cols + inter * stride_wr
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < hidden
        a = tl.load(x_rows + offs_k[None, :], mask=valid[:, None] & mask_k[None, :], other=0.0)
        mask_b = mask_k[:, None] & mask_n[None, :]
        bg = tl.load(gate_cols + offs_k[:, None], mask=mask_b, other=0.0)
        bu = tl.load(up_cols + offs_k[:, None], mask=mask_b, other=0.0)
        if UPCAST_DOT:  # Triton's CPU interpreter multiplies bfloat16 as its raw 16-bit integers
            a, bg, bu = a.to(tl.float32), bg.to(tl.float32), bu.to(tl.float32)
        if IEEE_FP32:  # float32 inputs: full-precision products, not tf32
            acc_gate = tl.dot(a, bg, acc_gate, input_precision="ieee")
            acc_up = tl.dot(a, bu, acc_up, input_precision="ieee")
        else:
            acc_gate = tl.dot(a, bg, acc_gate)
            acc_up = tl.dot(a, bu, acc_up)
    act = acc_gate * tl.sigmoid(acc_gate) * acc_up
    tl.store(act_ptr + slots[:, None] * inter + offs_n[None, :], act.to(act_ptr.dtype.element_ty),
             mask=valid[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=["num_experts"])
def _grouped_down_kernel(
    act_ptr, w2_ptr, sorted_ptr, counts_ptr, pair_start_ptr, block_end_ptr, y_ptr,
    num_experts, hidden, inter,
    stride_we, stride_wh,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EXPERTS_POW2: tl.constexpr, IEEE_FP32: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    block = tl.program_id(0)
    block_n = tl.program_id(1)
    expert, slots, valid = _row_block(block, counts_ptr, pair_start_ptr, block_end_ptr, num_experts,
                                      BLOCK_M, EXPERTS_POW2)
    if tl.max(valid.to(tl.int32), axis=0) == 0:
        return
    pairs = tl.load(sorted_ptr + slots, mask=valid, other=0)

    offs_n = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden
    w_cols = w2_ptr + expert * stride_we + offs_n[None, :] * stride_wh
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < inter
        a = tl.load(act_ptr + slots[:, None] * inter + offs_k[None, :], mask=valid[:, None] & mask_k[None, :],
                    other=0.0)
        b = tl.load(w_cols + offs_k[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if UPCAST_DOT:
            a, b = a.to(tl.float32), b.to(tl.float32)
        if IEEE_FP32:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    tl.store(y_ptr + pairs.to(tl.int64)[:, None] * hidden + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=valid[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=["top_k"])
def _weighted_sum_kernel(
    y_ptr, weights_ptr, out_ptr, top_k, hidden,
    stride_rt, stride_rk, stride_ot,
    BLOCK_N: tl.constexpr,
):
    tok = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in range(0, top_k):
        weight = tl.load(weights_ptr + tok * stride_rt + j * stride_rk).to(tl.float32)
        y = tl.load(y_ptr + (tok * top_k + j) * hidden + offs_n, mask=mask_n, other=0.0)
        acc += weight * y.to(tl.float32)
    tl.store(out_ptr + tok * stride_ot + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)


@dataclass(frozen=True)
class GroupedConfig:
    """Tile shapes, warps and pipeline depth of the two grouped GEMMs."""

    block_m: int = 64
    gate_up_n: int = 128
    gate_up_k: int = 64
    gate_up_warps: int = 4
    gate_up_stages: int = 3
    down_n: int = 128
    down_k: int = 64
    down_warps: int = 4
    down_stages: int = 2
    sum_n: int = 1024  # hidden columns per weighted-sum program


# By largest T served: the H200 sweep's winners at T = 1..32, 64, 512 and 4096/8192 (graph replay, L2 flushed;
# reports/moe-triton-2026-12-01/); the boundaries between those points are not measured. Larger row blocks
# pay once each expert has a few hundred rows. Re-measure with `qwen36 tune moe --sweep-configs` (docs/tuning.md).
GROUPED_CONFIGS: tuple[tuple[int, GroupedConfig], ...] = (
    (32, GroupedConfig(block_m=16, gate_up_n=64, gate_up_k=128, gate_up_warps=4, gate_up_stages=3,
                       down_n=128, down_k=64, down_warps=4, down_stages=2)),
    (256, GroupedConfig(block_m=16, gate_up_n=64, gate_up_k=64, gate_up_warps=4, gate_up_stages=4,
                        down_n=128, down_k=64, down_warps=4, down_stages=2)),
    (2048, GroupedConfig(block_m=32, gate_up_n=64, gate_up_k=128, gate_up_warps=4, gate_up_stages=3,
                         down_n=128, down_k=64, down_warps=4, down_stages=2)),
    (1 << 30, GroupedConfig(block_m=128, gate_up_n=128, gate_up_k=64, gate_up_warps=8, gate_up_stages=4,
                            down_n=128, down_k=64, down_warps=8, down_stages=3)),
)

_GROUP_BLOCK = 1024  # pairs per program of the grouping kernels


# Triton's CPU interpreter runs each program as Python calls: few programs keep the CI tests quick, while
# tiles smaller than the test dims still exercise every loop and mask.
INTERPRETER_CONFIG = GroupedConfig(block_m=16, gate_up_n=16, gate_up_k=32, down_n=32, down_k=16, sum_n=32)

# Whether TRITON_INTERPRET=1 was set when these kernels were defined: then they run on CPU tensors only.
INTERPRETED = defined_interpreted(_count_kernel)


def grouped_config(num_tokens: int) -> GroupedConfig:
    if INTERPRETED:
        return INTERPRETER_CONFIG
    for max_tokens, config in GROUPED_CONFIGS:
        if num_tokens <= max_tokens:
            return config
    return GROUPED_CONFIGS[-1][1]


def max_row_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Most row blocks any routing can need: every non-empty expert rounds its rows up to whole blocks."""
    return (num_pairs + min(num_experts, num_pairs) * (block_m - 1)) // block_m


def experts_triton_grouped(x, w13, w2, weights, ids, out, config: GroupedConfig | None = None):
    """The expert-path calling convention (model.moe.experts), for tensors whose last dim is contiguous;
    `config` overrides the per-T table."""
    num_tokens, top_k = ids.shape
    num_experts, hidden, inter = w13.shape[0], x.shape[1], w2.shape[2]
    num_pairs = num_tokens * top_k
    cfg = config or grouped_config(num_tokens)
    device = x.device

    counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
    rank = torch.empty(num_pairs, dtype=torch.int32, device=device)
    pair_start = torch.empty(num_experts, dtype=torch.int32, device=device)
    block_end = torch.empty(num_experts, dtype=torch.int32, device=device)
    sorted_pairs = torch.empty(num_pairs, dtype=torch.int32, device=device)
    group_grid = (triton.cdiv(num_pairs, _GROUP_BLOCK),)
    # At least 256 lanes: one compiled variant serves every expert count up to the real model's.
    experts_pow2 = max(256, triton.next_power_of_2(num_experts))
    id_strides = (top_k, ids.stride(0), ids.stride(1))
    _count_kernel[group_grid](ids, counts, rank, num_pairs, *id_strides, BLOCK=_GROUP_BLOCK)
    _offsets_kernel[(1,)](counts, pair_start, block_end, num_experts, BLOCK_M=cfg.block_m, EXPERTS_POW2=experts_pow2)
    _scatter_kernel[group_grid](ids, rank, pair_start, sorted_pairs, num_pairs, *id_strides, BLOCK=_GROUP_BLOCK)

    blocks = max_row_blocks(num_pairs, num_experts, cfg.block_m)
    flags = dict(
        EXPERTS_POW2=experts_pow2,
        IEEE_FP32=x.dtype == torch.float32,
        UPCAST_DOT=INTERPRETED and x.dtype == torch.bfloat16,
    )
    act = torch.empty((num_pairs, inter), dtype=x.dtype, device=device)
    _grouped_gate_up_kernel[(blocks, triton.cdiv(inter, cfg.gate_up_n))](
        x, w13, sorted_pairs, counts, pair_start, block_end, act,
        num_experts, top_k, hidden, inter,
        x.stride(0), w13.stride(0), w13.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.gate_up_n, BLOCK_K=cfg.gate_up_k,
        num_warps=cfg.gate_up_warps, num_stages=cfg.gate_up_stages, **flags,
    )
    y = torch.empty((num_pairs, hidden), dtype=x.dtype, device=device)
    _grouped_down_kernel[(blocks, triton.cdiv(hidden, cfg.down_n))](
        act, w2, sorted_pairs, counts, pair_start, block_end, y,
        num_experts, hidden, inter,
        w2.stride(0), w2.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.down_n, BLOCK_K=cfg.down_k,
        num_warps=cfg.down_warps, num_stages=cfg.down_stages, **flags,
    )
    _weighted_sum_kernel[(num_tokens, triton.cdiv(hidden, cfg.sum_n))](
        y, weights, out, top_k, hidden,
        weights.stride(0), weights.stride(1), out.stride(0),
        BLOCK_N=cfg.sum_n,
    )
    return out

