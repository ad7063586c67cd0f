"""Bytes and FLOPs per call: the least memory traffic (each input read once, each output written once) and the
arithmetic of the function, for the routed experts, the whole MoE block and one gated-delta-rule call."""
from __future__ import annotations

from dataclasses import dataclass

from model.gdn import GDNDims

from .ceilings import Ceilings
from .dims import MoEDims

__all__ = ["Work", "Floor", "floor_of", "moe_experts_work", "moe_block_work", "gdn_rule_work"]

F32, I64 = 4, 8


@dataclass(frozen=True)
class Work:
    bytes: float
    flops: float


@dataclass(frozen=True)
class Floor:
    hbm_us: float | None
    compute_us: float | None

    @property
    def us(self) -> float | None:
        known = [t for t in (self.hbm_us, self.compute_us) if t is not None]
        return max(known) if known else None


def floor_of(work: Work, ceilings: Ceilings) -> Floor:
    hbm = work.bytes / ceilings.hbm_bytes_per_s * 1e6 if ceilings.hbm_bytes_per_s else None
    compute = work.flops / ceilings.matrix_flops_per_s * 1e6 if ceilings.matrix_flops_per_s else None
    return Floor(hbm, compute)


def moe_experts_work(tokens: int, distinct_experts: int, d: MoEDims, elem: int) -> Work:
    """The weights of every expert the routing touches (w13 [2I, H] + w2 [H, I]), x in, out, the routing."""
    weights = distinct_experts * 3 * d.intermediate * d.hidden * elem
    activations = 2 * tokens * d.hidden * elem + tokens * d.top_k * (F32 + I64)
    return Work(weights + activations, 2.0 * tokens * d.top_k * 3 * d.intermediate * d.hidden)


def moe_block_work(tokens: int, distinct_experts: int, d: MoEDims, elem: int) -> Work:
    """Routed experts plus the router [E, H], the shared expert (3 [Is, H] matrices) and its gate [1, H]."""
    routed = moe_experts_work(tokens, distinct_experts, d, elem)
    extra_weights = (d.experts + 3 * d.shared_intermediate + 1) * d.hidden * elem
    extra_flops = 2.0 * tokens * d.hidden * (d.experts + 3 * d.shared_intermediate + 1)
    return Work(routed.bytes + extra_weights, routed.flops + extra_flops)


def gdn_rule_work(batch: int, tokens: int, d: GDNDims, elem: int) -> Work:
    """q, k, v in and the output out (activation dtype), g and beta (float32), the float32 state in and out.
    FLOPs of the recurrence per token and value head: decay (KV), k^T S (2KV), the rank-1 write (2KV) and
    the read-out S^T q (2KV); the chunked forms do more, so this is a lower bound."""
    per_token = (2 * d.num_k_heads * d.head_k_dim + 2 * d.num_v_heads * d.head_v_dim) * elem + 2 * d.num_v_heads * F32
    state = 2 * batch * d.num_v_heads * d.head_k_dim * d.head_v_dim * F32
    flops = 7.0 * batch * tokens * d.num_v_heads * d.head_k_dim * d.head_v_dim
    return Work(batch * tokens * per_token + state, flops)
