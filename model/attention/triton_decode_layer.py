"""The middle of the gated attention decode layer (T == 1, StaticKVCache) in one Triton kernel: everything between
the stacked q/k/v GEMM and o_proj.

Eagerly, the staged layer (model.attention.layer.gated_attention_static) is ~60 launches at tens of microseconds of host
time each. Here one launch takes the projection row of each sequence, proj = x @ AttentionWeights.qkv_stacked^T,
laid out [q | gate per query head (head h: D q, then D gate) | k per kv head | v per kv head], and, on chip:

    q = rope(q_norm(q)), k = rope(k_norm(k))   zero-centred RMSNorm x * rsqrt(mean(x^2) + eps) * (1 + w) over D,
                                               then partial NeoX rope at position L = cache.length: the first
                                               rotary_dim dims in pairs (i, i + rotary_dim/2), the rest unrotated
    k_new, v_new = k, v rounded to the cache dtype (as the staged path stores them); stored at position L
    o = softmax(q [k_0 .. k_{L-1}, k_new]^T / sqrt(D)) [v_0 .. v_{L-1}, v_new]   (online softmax, float32)
    out = o * sigmoid(gate)                    in the activation dtype, [B, NH*D]

Everything is float32 on chip; the result is not rounded on the way (the staged path rounds q, k, v, the scores'
inputs and o to the activation dtype), so it is closer to the float64 reference than the staged path's and not
bit-equal to it. The rope angles come from a float32 table [max_len, rotary_dim/2] computed in float64 and cast
(`rope_table`, as model.attention.rope does), never from float32 angles in the kernel: pos * inv_freq in float32 is off
by up to pos * 2^-24 radians, 1.6e-2 at position 262144. The table is built once per (rotary_dim, theta, max_len,
device), on the first call: make that call eagerly (a warm-up) before capturing the step in a CUDA graph; a
first call under capture raises rather than capture the table's construction.

Grid: (B, NH), one program per (sequence, query head); query head h reads kv head h // (NH / NKV) (GQA as
repeat_interleave). No race: the programs of one kv head read the cached positions [0, L) only and take the new
token's key and value from their own registers (rounded to the cache dtype, the same bits as the stored copy);
only the program with h % (NH / NKV) == 0 stores position L, which no program reads. The key blocks are summed in
a fixed order, so the result is deterministic. L is loaded on the device (the loop bound is a runtime value): no
host read, so the step stays capturable. A length at or past max_len (which the owner refuses before the step)
stores nothing and reads nothing past the buffers.

Known limit: one program streams the whole prefix of its sequence, serially over key blocks. At the per-rank
dims (NH 4) a B = 1 step runs 4 programs; at a few hundred keys that is a few microseconds, but long contexts
(thousands of keys at small B) would want a split-K (flash-decoding) variant that spreads the keys over programs
and combines their partial softmaxes: not built.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..dispatch import triton_support
from ..dispatch.triton_launch import PlansByOwner, PreparedLaunch
from ..dispatch.triton_support import defined_interpreted
from .rope import rope_cos_sin

__all__ = ["INTERPRETED", "attention_decode_core", "rope_table", "unavailable_reason"]

_LOW_PRECISION = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _rstd(row, offs, mask, eps, HEAD_DIM: tl.constexpr):
    """rsqrt(mean(x^2) + eps) of the head's D values at `row`, float32."""
    x = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    return tl.rsqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)


@triton.jit
def _normed_rotated(row, w_ptr, rstd, cos, sin, offs, partner, mask, rotates, first):
    """The head at `row` normed (x * rstd * (1 + w)) and rotated: dims i < rotary_dim/2 become
    x_i cos - x_{i+half} sin, dims half <= i < rotary_dim x_i cos + x_{i-half} sin, the rest pass through.
    The partner dims are read again from memory (the norm is elementwise once rstd is known)."""
    x = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    x = x * rstd * (1.0 + tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32))
    xp = tl.load(row + partner, mask=rotates, other=0.0).to(tl.float32)
    xp = xp * rstd * (1.0 + tl.load(w_ptr + partner, mask=rotates, other=0.0).to(tl.float32))
    sign = tl.where(first, -1.0, 1.0)
    return tl.where(rotates, x * cos + sign * xp * sin, x)


@triton.jit
def _attention_decode_kernel(
    proj_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, length_ptr, out_ptr,
    stride_p, skb, skh, sks, skd, svb, svh, svs, svd, stride_rope, stride_o, max_len,
    scale, eps,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    BD: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)  # int64: b * stride cannot overflow at large batches
    h = tl.program_id(1)
    group = NUM_HEADS // NUM_KV_HEADS
    kvh = h // group
    offs = tl.arange(0, BD)
    mask = offs < HEAD_DIM
    rotates = offs < 2 * HALF
    first = offs < HALF
    partner = tl.where(first, offs + HALF, offs - HALF)

    length = tl.load(length_ptr).to(tl.int32)  # the new token's position, read on the device
    prefix = tl.minimum(length, max_len)  # never past the buffers, even at a length the owner should refuse
    rope_row = tl.minimum(length, max_len - 1) * stride_rope
    pair = tl.where(first, offs, offs - HALF)
    cos = tl.load(cos_ptr + rope_row + pair, mask=rotates, other=1.0)
    sin = tl.load(sin_ptr + rope_row + pair, mask=rotates, other=0.0)

    row = proj_ptr + b * stride_p
    q_row = row + h * (2 * HEAD_DIM)
    k_row = row + 2 * NUM_HEADS * HEAD_DIM + kvh * HEAD_DIM
    v_row = row + (2 * NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM + kvh * HEAD_DIM
    q_rstd = _rstd(q_row, offs, mask, eps, HEAD_DIM)
    k_rstd = _rstd(k_row, offs, mask, eps, HEAD_DIM)
    q = _normed_rotated(q_row, q_norm_ptr, q_rstd, cos, sin, offs, partner, mask, rotates, first)
    k = _normed_rotated(k_row, k_norm_ptr, k_rstd, cos, sin, offs, partner, mask, rotates, first)
    # The new key and value as the cache stores them; attended from here, never read back from the cache.
    k_new = k.to(k_cache_ptr.dtype.element_ty)
    v_new = tl.load(v_row + offs, mask=mask, other=0.0).to(v_cache_ptr.dtype.element_ty)

    # Online softmax over the cached positions [0, length), key blocks in a fixed order.
    k_base = k_cache_ptr + b * skb + kvh * skh
    v_base = v_cache_ptr + b * svb + kvh * svh
    pos_offs = tl.arange(0, BLOCK_S)
    m = -float("inf")
    l = 0.0
    acc = tl.zeros([BD], dtype=tl.float32)
    for start in range(0, prefix, BLOCK_S):
        pos = start + pos_offs
        live = pos < prefix
        tile = live[:, None] & mask[None, :]
        keys = tl.load(k_base + pos[:, None] * sks + offs[None, :] * skd, mask=tile, other=0.0).to(tl.float32)
        scores = tl.where(live, tl.sum(keys * q[None, :], axis=1) * scale, -float("inf"))
        m_next = tl.maximum(m, tl.max(scores, axis=0))
        alpha = tl.exp(m - m_next)
        p = tl.exp(scores - m_next)
        values = tl.load(v_base + pos[:, None] * svs + offs[None, :] * svd, mask=tile, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * values, axis=0)
        l = l * alpha + tl.sum(p, axis=0)
        m = m_next

    # The new token, last.
    s_new = tl.sum(q * k_new.to(tl.float32), axis=0) * scale
    m_next = tl.maximum(m, s_new)
    alpha = tl.exp(m - m_next)
    p_new = tl.exp(s_new - m_next)
    acc = acc * alpha + p_new * v_new.to(tl.float32)
    l = l * alpha + p_new

    gate = tl.load(q_row + HEAD_DIM + offs, mask=mask, other=0.0).to(tl.float32)
    o = acc / l * tl.sigmoid(gate)
    tl.store(out_ptr + b * stride_o + h * HEAD_DIM + offs, o.to(out_ptr.dtype.element_ty), mask=mask)

    # One program per kv head stores the new token, and none at a length past the buffers. (A scalar condition
    # as a bound on offs: the interpreter mishandles a boolean vector & a boolean scalar.)
    stored = offs < tl.where(length < max_len, tl.where(h % group == 0, HEAD_DIM, 0), 0)
    tl.store(k_base + length * sks + offs * skd, k_new, mask=stored)
    tl.store(v_base + length * svs + offs * svd, v_new, mask=stored)


# Whether TRITON_INTERPRET=1 was set when the kernel was defined: then it runs on CPU tensors only.
INTERPRETED = defined_interpreted(_attention_decode_kernel)


def unavailable_reason(device: torch.device) -> str | None:
    return triton_support.unavailable_reason(device, INTERPRETED)


@functools.lru_cache(maxsize=None)
def rope_table(rotary_dim: int, theta: float, max_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin float32 [max_len, rotary_dim/2] for positions 0..max_len-1: model.attention.rope.rope_cos_sin's values
    (computed in float64, cast), the first half of each row (the second repeats it). Built once per key and kept
    for the process. Not under CUDA graph capture: the capture would record the construction, not run it."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("the attention decode kernel's rope table is built on its first call, which must not be "
                           "under CUDA graph capture: run the step once eagerly (a warm-up) before capturing it")
    cos, sin = rope_cos_sin(torch.arange(max_len, device=device), rotary_dim, theta, torch.float32)
    half = rotary_dim // 2
    return cos[:, :half].contiguous(), sin[:, :half].contiguous()


@functools.cache
def _tile(head_dim: int) -> tuple[int, int, int]:
    """(BD, BLOCK_S, num_warps), cached: triton.next_power_of_2 costs microseconds of host time a call.
    Key and value tiles of BLOCK_S x BD float32: 8192 elements over 8 warps at D 128 and 256 (32 a thread)."""
    bd = triton.next_power_of_2(head_dim)
    block_s = max(16, min(64, 8192 // bd))
    return bd, block_s, 4 if bd * block_s <= 4096 else 8


def _check(proj: torch.Tensor, w, cache) -> None:
    # Once per launch plan (model.dispatch.triton_launch): what the kernel cannot take, said before it runs.
    if proj.dtype not in _LOW_PRECISION:
        raise TypeError(f"the attention decode kernel takes {_LOW_PRECISION}, not {proj.dtype}; use the 'staged' path")
    if proj.is_cuda == INTERPRETED:
        raise ValueError(f"the attention decode kernel cannot run on {proj.device}: {unavailable_reason(proj.device)}")
    if proj.stride(-1) != 1:
        raise ValueError(f"the attention decode kernel reads each projection row with unit stride; proj has strides "
                         f"{proj.stride()}")
    for what, t in (("cache.k", cache.k), ("cache.v", cache.v)):
        if t.dtype not in _LOW_PRECISION:
            raise TypeError(f"the attention decode kernel keeps the KV cache in {_LOW_PRECISION}; {what} is {t.dtype}")
        if t.device != proj.device:
            raise ValueError(f"{what} is on {t.device}, the activations on {proj.device}")
    length = cache.length
    if length.dtype != torch.int64 or length.dim() != 0 or length.device != proj.device:
        raise ValueError(f"cache.length must be a 0-dim int64 tensor on {proj.device}; it is {length.dtype} "
                         f"{tuple(length.shape)} on {length.device}")
    for what, t in (("q_norm", w.q_norm), ("k_norm", w.k_norm)):
        if t.stride(0) != 1 or t.device != proj.device:  # the kernel indexes these vectors without a stride
            raise ValueError(f"the attention decode kernel reads {what} as a contiguous vector on {proj.device}; "
                             f"it has stride {t.stride(0)} on {t.device}")


class _Plan:
    """What one call shape launches with: the prepared launch (model.dispatch.triton_launch: the JIT's argument binding
    paid on the first call only) and the rope table."""

    __slots__ = ("launch", "cos", "sin")

    def __init__(self, launch, cos: torch.Tensor, sin: torch.Tensor):
        self.launch, self.cos, self.sin = launch, cos, sin


# Per weights object: one plan per call shape (model.dispatch.triton_launch), so an eager decode step pays the JIT's
# argument binding once per shape rather than on every call.
_PLANS = PlansByOwner()


def attention_decode_core(proj: torch.Tensor, w, cache) -> torch.Tensor:
    """o * sigmoid(gate) [B, NH*D] in proj's dtype from proj [B, NH*2D + 2*NKV*D] (= x @ w.qkv_stacked^T), the
    weights `w` (AttentionWeights) and `cache` (StaticKVCache): writes the token's rotated key and its value at
    position cache.length and attends over positions 0..cache.length. Shapes are the caller's to check
    (model.attention.decode_layer)."""
    k, v, length = cache.k, cache.v, cache.length
    # Everything the kernel specialises on that can change between calls with one weights object (the weights'
    # own layout is fixed; the output is a fresh allocation, always aligned; the rope table is the plan's).
    key = (proj.shape, proj.dtype, proj.device, proj.stride(), proj.data_ptr() % 16,
           length.dtype, length.data_ptr() % 16, *((t.shape, t.dtype, t.stride(), t.data_ptr() % 16) for t in (k, v)))
    plans = _PLANS.of(w)
    plan = plans.get(key)
    d = w.dims
    batch = proj.shape[0]
    if plan is None:
        _check(proj, w, cache)
        bd, block_s, num_warps = _tile(d.head_dim)
        meta = {"NUM_HEADS": d.num_heads, "NUM_KV_HEADS": d.num_kv_heads, "HEAD_DIM": d.head_dim,
                "HALF": d.rotary_dim // 2, "BD": bd, "BLOCK_S": block_s, "num_warps": num_warps}
        cos, sin = rope_table(d.rotary_dim, float(d.rope_theta), k.shape[2], k.device)
        plan = plans[key] = _Plan(PreparedLaunch(_attention_decode_kernel, (batch, d.num_heads), meta), cos, sin)
    out = torch.empty(batch, d.num_heads * d.head_dim, dtype=proj.dtype, device=proj.device)
    if batch == 0:
        return out
    plan.launch(
        proj, w.q_norm, w.k_norm, plan.cos, plan.sin, k, v, length, out,
        proj.stride(0), *k.stride(), *v.stride(), plan.cos.stride(0), out.stride(0), k.shape[2],
        d.head_dim ** -0.5, d.eps,
    )
    return out
