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

from . import triton_decode, triton_router
from ..triton_support import last_dim_contiguous
from .block import MoEWeights
from .triton_decode import SharedExpert

__all__ = ["moe_block_triton_fused"]


def moe_block_triton_fused(x: torch.Tensor, w: MoEWeights) -> torch.Tensor:
    """The MoE block of x [T, H] in x's dtype, routed by the fused Triton router (the tie rule of
    model.moe.router). Every weight must have x's dtype: the kernels read routed and shared weights alike."""
    if x.dim() != 2 or x.shape[1] != w.w13.shape[2]:
        raise ValueError(f"x has shape {tuple(x.shape)}; the fused MoE block takes [T, {w.w13.shape[2]}]")
    mismatched = {name: t.dtype for name, t in w.tensors().items() if t.dtype != x.dtype}
    if mismatched:
        raise ValueError(f"the fused MoE block needs every weight in x's dtype {x.dtype}; {mismatched} differ: "
                         "convert the weights (MoEWeights.to) or use the 'composed' block")
    why = triton_router.unavailable_reason(x.device)
    if why is not None:
        raise ValueError(f"the fused MoE block cannot run on {x.device}: {why}; use the 'composed' block")
    x = last_dim_contiguous(x)
    logits = F.linear(x, w.router)
    weights, ids = triton_router.route_triton_fused(logits, w.top_k)
    shared = SharedExpert(*(last_dim_contiguous(t) for t in (w.shared_w1, w.shared_w3, w.shared_w2, w.shared_gate)))
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return triton_decode.experts_and_shared_triton_decode(
        x, last_dim_contiguous(w.w13), last_dim_contiguous(w.w2), weights, ids, shared, out,
    )
