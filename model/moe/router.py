"""MoE router: which experts each token visits and with what weight.

Tie rule (every variant): experts are ranked by their float32 router logit, larger first; among exactly
equal logits the lower expert id ranks first. Selection is defined on the logits, not on the rounded
softmax probabilities: softmax is monotonic, so both orders agree in exact arithmetic, but rounding can
make two different logits produce equal float32 probabilities and invent a tie that does not exist.

The variants are registered in `ROUTERS`, a path table (model.dispatch.paths) whose entries are called like the
routers themselves; `triton_fused` (model.moe.triton_router) runs only where Triton does (`supports`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dispatch import triton_support
from ..dispatch.paths import ComputePath, DtypeRule, PathTable

try:
    import triton  # noqa: F401  (only whether it imports)
except ImportError:  # a torch build or platform without Triton
    triton = None

if triton is not None:
    from . import triton_router

__all__ = [
    "ROUTERS",
    "RouterPath",
    "route_reference",
    "route_topk_softmax",
    "route_triton_fused",
    "topk_lowest_id_on_ties",
]


def _as_router_logits(logits: torch.Tensor) -> torch.Tensor:
    # `+ 0.0` folds -0.0 into +0.0 so a signed zero can never break an exact tie.
    return logits.float() + 0.0


def _check_top_k(logits: torch.Tensor, top_k: int) -> None:
    num_experts = logits.shape[-1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be between 1 and the number of experts ({num_experts})")


def route_reference(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3.5 routing as specified: fp32 softmax over all experts -> top-k -> renormalise.

    Returns (weights float32 [T, k], expert ids int64 [T, k]), ranked by the tie rule. The ranking is a
    stable descending sort, written for clarity, not speed.
    """
    _check_top_k(logits, top_k)
    logits = _as_router_logits(logits)
    probs = torch.softmax(logits, dim=-1)
    ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :top_k]
    picked = probs.gather(-1, ids)
    return picked / picked.sum(dim=-1, keepdim=True), ids


def _order_preserving_int(values: torch.Tensor) -> torch.Tensor:
    """Map float32 to int64 so that integer order equals float order (NaN ranks above +inf)."""
    bits = values.contiguous().view(torch.int32).to(torch.int64)
    # Negative floats compare in reverse bit order: flip their magnitude bits.
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def topk_lowest_id_on_ties(values: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk` with the tie rule made exact: pack (value, -expert id) into one int64 key.

    torch.topk leaves the order of equal values unspecified (and it differs between CPU and CUDA).
    """
    num_experts = values.shape[-1]
    expert_ids = torch.arange(num_experts, device=values.device, dtype=torch.int64)
    key = (_order_preserving_int(values) << 20) | (num_experts - 1 - expert_ids)
    ids = torch.topk(key, top_k, dim=-1).indices
    return values.gather(-1, ids), ids


def route_topk_softmax(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimised variant: top-k of the logits, then a softmax over only those k.

    Equal to the reference because softmax(z)_i / sum_{j in S} softmax(z)_j = softmax(z_S)_i: the full
    normaliser cancels. It avoids the [T, num_experts] softmax.
    """
    _check_top_k(logits, top_k)
    if logits.shape[-1] >= 1 << 20:
        raise ValueError("route_topk_softmax packs expert ids into 20 bits: at most 1048575 experts")
    top_logits, ids = topk_lowest_id_on_ties(_as_router_logits(logits), top_k)
    return torch.softmax(top_logits, dim=-1), ids


def route_triton_fused(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`route_topk_softmax` in one Triton kernel (model.moe.triton_router): one launch instead of ~10."""
    _check_top_k(logits, top_k)
    if triton is None:
        raise ValueError("the 'triton_fused' router needs Triton, which is not installed; use 'topk_softmax'")
    return triton_router.route_triton_fused(logits, top_k)


def _triton_router_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    return triton_support.unavailable_reason(device, None if triton is None else triton_router.INTERPRETED)


def _always_float32(dtype: torch.dtype) -> torch.dtype:
    return torch.float32


@dataclass(frozen=True)
class RouterPath(ComputePath):
    """A router's table entry, called like the router itself: `ROUTERS[name](logits, top_k)`, as
    `moe_block(..., router=name)` does."""

    output_dtype_rule: DtypeRule = _always_float32  # routing weights are float32 whatever the logits' dtype

    def __call__(self, logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fn(logits, top_k)


# Every router variant; tests iterate this table (a path's `supports` says where it runs: check it before
# calling a path on a device). Input dtype is the logits' dtype.
ROUTERS = PathTable("router", [
    RouterPath("reference", route_reference, "fp32 softmax over all experts, stable sort, renormalise",
               is_reference=True),
    RouterPath("topk_softmax", route_topk_softmax, "top-k of the logits by packed int64 keys, softmax over the k"),
    RouterPath("triton_fused", route_triton_fused, "top-k and softmax in one Triton kernel, one program per token",
               why_unavailable=_triton_router_unavailable),
])
