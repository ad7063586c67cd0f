"""`dense_bmm`: the distinct selected experts' weights gathered once, every one of them applied to every token.

tiny_bmm gathers one weight copy per (token, expert) pair, T * k copies however often an expert repeats.
This path gathers each selected expert once (U <= min(E, T * k) of them), runs all U experts over all T
tokens in two `torch.bmm`s and combines them with the dense [T, U] matrix of routing weights (zero where a
token did not pick the expert). It computes U * T expert rows where the pair paths compute T * k, so it is
registered for small token counts only; it runs on any device (torch.unique reads the ids back to the host,
so it does not capture in a CUDA graph).
"""
from __future__ import annotations

import torch

from ...dispatch.paths import ComputePath, compute_dtype
from ..experts import EXPERT_PATHS, silu_and_mul

__all__ = ["experts_dense_bmm"]

# Past this the U * T expert rows cost far more than the T * k the pair and grouped paths compute.
DENSE_MAX_TOKENS = 64


def experts_dense_bmm(x, w13, w2, weights, ids, out):
    """Distinct experts gathered once; [U, T] expert outputs by two bmm; summed with the dense routing weights."""
    experts, local = torch.unique(ids, return_inverse=True)  # distinct ids [U]; ids == experts[local]
    acc = compute_dtype(x.dtype)  # the weighted sum over experts: float32, float64 for float64 inputs
    # routing[t, u]: token t's weight for expert experts[u]; scatter_add sums a repeated id, as the reference does.
    routing = torch.zeros(ids.shape[0], experts.numel(), dtype=acc, device=x.device)
    routing.scatter_add_(1, local, weights.to(acc))
    tokens = x.unsqueeze(0).expand(experts.numel(), -1, -1)  # [U, T, H], no copy
    h = torch.bmm(tokens, w13[experts].transpose(1, 2))  # [U, T, 2I]
    y = torch.bmm(silu_and_mul(h), w2[experts].transpose(1, 2))  # [U, T, H]
    return out.copy_(torch.einsum("tu,uth->th", routing, y.to(acc)))


EXPERT_PATHS.register(
    ComputePath(
        "dense_bmm",
        experts_dense_bmm,
        "distinct experts gathered once, all of them on every token in two bmm, dense routing sum",
        max_tokens=DENSE_MAX_TOKENS,
    )
)
