"""The whole sparse MoE block for small T in four launches: what an eager decode step pays for is launches.

    1. logits = x @ router.T                      (cuBLAS, as the composed block does it: the same routing logits)
    2. top-k ids and softmax weights              (model.moe.triton_router: the `triton_fused` router's kernel)
    3. gate-up + SiLU for k + 1 slots per token   (model.moe.triton_decode; slot k is the shared expert, and
                                                   one of its programs per token takes x . shared_gate)
    4. down, summed over the k routed slots with their routing weights plus the shared slot weighted by
       sigmoid(shared gate logit), in float32, stored once in x's dtype

The shared gate's logit comes from launch 3 (one H-long dot product per token, in float32) rather than from a
GEMM over a concatenated [router; shared_gate] weight: no cached copy of the weights to keep in step with them,
and the router logits are exactly the composed block's. Deterministic (no atomics) and free of host
synchronisation, so it can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dispatch.triton_launch import LaunchPlan, PlansByOwner
from . import triton_decode, triton_router
from .block import MoEWeights
from .triton_decode import SharedExpert

__all__ = ["moe_block_triton_fused"]


# Per weights object: one launch plan per call shape of x (model.dispatch.triton_launch): an eager decode step launches
# the same kernels with the same weights every step, so the JIT's binding is paid once per shape, not per call.
_PLANS = PlansByOwner()


def moe_block_triton_fused(x: torch.Tensor, w: MoEWeights) -> torch.Tensor:
    """The MoE block of x [T, H] in x's dtype, routed by the fused Triton router (the tie rule of
    model.moe.router). Every weight must have x's dtype: the kernels read routed and shared weights alike."""
    plans = _PLANS.of(w)
    # Everything the kernels specialise on that can change between calls with one weights object: x's shape,
    # dtype, device, strides and 16-byte alignment (the weights' own are fixed: MoEWeights is frozen, and the
    # buffers below are fresh allocations, always aligned).
    key = (x.shape, x.dtype, x.device, x.stride(), x.data_ptr() % 16)
    entry = plans.get(key)
    if entry is None:
        _check(x, w)
        # The kernels read rows whose last dim is contiguous: anything else is copied on every call (rare).
        entry = plans[key] = (LaunchPlan(), x.stride(1) != 1, any(t.stride(-1) != 1 for t in w.tensors().values()))
    plan, copy_x, copy_w = entry
    if copy_x:
        x = x.contiguous()
    if copy_w:
        w = MoEWeights(**{name: t.contiguous() for name, t in w.tensors().items()}, top_k=w.top_k)
    logits = F.linear(x, w.router)
    weights, ids = triton_router.route_into(logits, w.top_k, plan)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return triton_decode.experts_and_shared_triton_decode(
        x, w.w13, w.w2, weights, ids, _shared(w), out, launch=plan,
    )


def _check(x: torch.Tensor, w: MoEWeights) -> None:
    if x.dim() != 2 or x.shape[1] != w.w13.shape[2]:
        raise ValueError(f"x has shape {tuple(x.shape)}; the fused MoE block takes [T, {w.w13.shape[2]}]")
    mismatched = {name: t.dtype for name, t in w.tensors().items() if t.dtype != x.dtype}
    if mismatched:
        raise ValueError(f"the fused MoE block needs every weight in x's dtype {x.dtype}; {mismatched} differ: "
                         "convert the weights (MoEWeights.to) or use the 'composed' block")
    why = triton_router.unavailable_reason(x.device)
    if why is not None:
        raise ValueError(f"the fused MoE block cannot run on {x.device}: {why}; use the 'composed' block")
    if w.router.shape[0] > triton_router.MAX_EXPERTS:
        raise ValueError(f"the fused MoE block's router holds at most {triton_router.MAX_EXPERTS} experts, not "
                         f"{w.router.shape[0]}; use the 'composed' block")


def _shared(w: MoEWeights) -> SharedExpert:
    return SharedExpert(w.shared_w1, w.shared_w3, w.shared_w2, w.shared_gate)
