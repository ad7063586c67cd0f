"""The MoE router in one Triton kernel: top-k of the router logits by the tie rule, then a softmax over the k.

One program per token holds the token's E logits in registers as int64 keys that rank exactly as the tie
rule does (model.moe.router): the high 32 bits are the float32 logit mapped to an order-preserving integer,
the low 32 bits `E - 1 - expert id`, so the largest key is the largest logit and, among equal logits, the
lowest id. Each of the k selections is one max reduction (keys are unique, so the winner is removed by
equality); the weights are the softmax over the k selected logits, which equals the reference's full
softmax renormalised over the k (the full normaliser cancels). It replaces the ~10 small launches of
`route_topk_softmax` (cast, +0.0, int view, where, shift/or, topk, gather, softmax) with one, which matters
where decode runs eagerly. The router GEMM (F.linear) stays outside: cuBLAS is right for it.

The kernel launches without a host synchronisation, so it can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..dispatch import triton_support
from ..dispatch.triton_launch import jit_launch
from ..dispatch.triton_support import defined_interpreted

__all__ = ["INTERPRETED", "MAX_EXPERTS", "route_triton_fused", "unavailable_reason"]

# All E logits of a token live in one program's registers: past this many, they would spill.
MAX_EXPERTS = 8192


@triton.jit(do_not_specialize=["top_k"])
def _route_topk_softmax_kernel(
    logits_ptr, weights_ptr, ids_ptr,
    num_experts, top_k,
    stride_lt, stride_le, stride_wt, stride_it,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    tok = tl.program_id(0)
    offs_e = tl.arange(0, BLOCK_E)
    valid = offs_e < num_experts
    row = logits_ptr + tok.to(tl.int64) * stride_lt
    # `+ 0.0` as the reference does it (on CUDA it also turns every NaN into the canonical positive one).
    logit = tl.load(row + offs_e * stride_le, mask=valid, other=0.0).to(tl.float32) + 0.0
    bits = logit.to(tl.int32, bitcast=True)
    # Sign-magnitude -> two's complement: integer order equals float order, -0.0 and +0.0 both map to 0
    # (whether or not the compiler kept the `+ 0.0`), a NaN with the sign bit clear ranks above +inf.
    order = tl.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    key = (order.to(tl.int64) << 32) | (num_experts - 1 - offs_e).to(tl.int64)
    # Below every real key (the smallest is -(2**31 - 1) << 32): padding lanes and experts already taken.
    taken = tl.full([BLOCK_E], -(1 << 63), tl.int64)
    key = tl.where(valid, key, taken)

    offs_k = tl.arange(0, BLOCK_K)
    top = tl.full([BLOCK_K], -(1 << 63), tl.int64)
    for j in range(top_k):
        best = tl.max(key, axis=0)
        top = tl.where(offs_k == j, best, top)
        key = tl.where(key == best, taken, key)

    in_k = offs_k < top_k
    ids = (num_experts - 1) - (top - ((top >> 32) << 32))  # the low 32 bits, undone
    ids = tl.where(in_k, ids, 0)
    picked = tl.load(row + ids * stride_le, mask=in_k, other=0.0).to(tl.float32) + 0.0
    # Shift by the first pick, not by a float max: it is the largest logit, and a NaN there poisons the row
    # exactly as torch.softmax does (a float max may drop the NaN).
    first = tl.sum(tl.where(offs_k == 0, picked, 0.0), axis=0)
    scaled = tl.where(in_k, tl.exp(picked - first), 0.0)
    weights = scaled / tl.sum(scaled, axis=0)
    tl.store(weights_ptr + tok.to(tl.int64) * stride_wt + offs_k, weights, mask=in_k)
    tl.store(ids_ptr + tok.to(tl.int64) * stride_it + offs_k, ids, mask=in_k)


# Whether TRITON_INTERPRET=1 was set when the kernel was defined: then it runs on CPU tensors only.
INTERPRETED = defined_interpreted(_route_topk_softmax_kernel)


def unavailable_reason(device: torch.device) -> str | None:
    """None where the kernel can run: CUDA when compiled, the CPU under the interpreter."""
    return triton_support.unavailable_reason(device, INTERPRETED)


def _num_warps(block_e: int) -> int:
    # One warp reduces 256 lanes with shuffles only; wider rows get more warps so each holds <= 8 keys a thread.
    return max(1, min(8, block_e // 256))


def route_triton_fused(logits: torch.Tensor, top_k: int, launch=jit_launch) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [..., E] (any float dtype) -> (weights float32 [..., k], expert ids int64 [..., k]).

    Callers check top_k first (model.moe.router); this checks what only this kernel limits. `launch`: how the
    kernel is launched (model.dispatch.triton_launch: the JIT, or a caller's prepared plan).
    """
    num_experts = logits.shape[-1]
    if num_experts > MAX_EXPERTS:
        raise ValueError(
            f"the fused Triton router holds a token's logits in registers: at most {MAX_EXPERTS} experts, "
            f"not {num_experts}; use the 'topk_softmax' router"
        )
    why = unavailable_reason(logits.device)
    if why is not None:
        raise ValueError(f"the fused Triton router cannot run on {logits.device}: {why}; use another router")
    if not logits.is_floating_point():
        raise TypeError(f"router logits must be a float tensor, not {logits.dtype}")
    flat = logits.reshape(-1, num_experts)  # a view for the usual [T, E]
    weights, ids = route_into(flat, top_k, launch)
    out_shape = logits.shape[:-1] + (top_k,)
    return weights.view(out_shape), ids.view(out_shape)


def route_into(flat: torch.Tensor, top_k: int, launch=jit_launch) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel alone, for checked logits [T, E]: (weights float32 [T, k], ids int64 [T, k])."""
    num_tokens, num_experts = flat.shape
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=flat.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int64, device=flat.device)
    if num_tokens > 0:
        block_e = triton.next_power_of_2(num_experts)
        meta = {"BLOCK_E": block_e, "BLOCK_K": triton.next_power_of_2(top_k), "num_warps": _num_warps(block_e)}
        launch(_route_topk_softmax_kernel, (num_tokens,), meta)(
            flat, weights, ids,
            num_experts, top_k,
            flat.stride(0), flat.stride(1), weights.stride(0), ids.stride(0),
        )
    return weights, ids
