"""Bytes and FLOPs per call: the least memory traffic (each input read once, each output written once) and the
arithmetic of the function, for the routed experts, the whole MoE block and one gated-delta-rule call; and the
least traffic of one whole decode step, per block kind (`decode_step_bytes`)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from model.attention.layer import AttentionDims
from model.gdn import GDNDims
from model.qwen36 import Qwen36Config

from .ceilings import Ceilings
from .dims import MoEDims

__all__ = ["Work", "Floor", "floor_of", "moe_experts_work", "moe_block_work", "gdn_rule_work", "gdn_conv_work",
           "gated_norm_work", "attention_decode_work", "add_rms_norm_work", "moe_dims_of",
           "expected_distinct_experts", "gdn_decode_bytes", "attention_decode_bytes", "rms_norm_bytes",
           "lm_head_bytes", "embed_bytes", "dense_mlp_bytes", "decode_step_bytes"]

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


def gdn_conv_work(batch: int, tokens: int, d: GDNDims, elem: int) -> Work:
    """The causal conv1d of the layer's q/k/v channels: x in and y out, the conv weight, the conv state in and the
    new one out, all in the activation dtype; W multiply-adds per output and the SiLU (about 4 operations)."""
    channels, taps = d.conv_dim, d.conv_kernel
    moved = (2 * batch * tokens * channels + channels * taps + 2 * batch * channels * (taps - 1)) * elem
    return Work(moved, batch * tokens * channels * (2.0 * taps + 4))


def gated_norm_work(rows: int, d: GDNDims, elem: int) -> Work:
    """The gated RMSNorm over `rows` tokens of HV heads: x and z in, y out, the weight; about 10 operations an
    element (square, sum, scale, weight, the SiLU gate)."""
    per_row = d.num_v_heads * d.head_v_dim
    return Work((3 * rows * per_row + d.head_v_dim) * elem, 10.0 * rows * per_row)


def attention_decode_work(batch: int, context: int, d: AttentionDims, elem: int) -> Work:
    """One full-attention decode layer (attention_decode_bytes); FLOPs: the four projections (2 a weight and
    sequence) and, per query head, q k^T and p v over the `context` + 1 keys (4 D each)."""
    q, kv = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
    projections = 2.0 * batch * d.hidden_size * (2 * q + 2 * kv + q)
    scores = 4.0 * batch * d.num_heads * d.head_dim * (context + 1)
    return Work(attention_decode_bytes(batch, context, d, elem), projections + scores)


def add_rms_norm_work(rows: int, hidden: int, elem: int) -> Work:
    """The residual add and the zero-centred RMSNorm after it: h and y in, the sum and the normed rows out, the
    weight; about 6 operations an element (add, square, sum, scale, 1 + w, multiply)."""
    return Work((4 * rows * hidden + hidden) * elem, 6.0 * rows * hidden)


# --- one decode step of the whole model (T = 1 per sequence, B sequences), bytes per block kind -------------

def moe_dims_of(cfg: Qwen36Config) -> MoEDims:
    """The MoE block's dims of a config (of one rank's, for per-rank dims)."""
    return MoEDims(hidden=cfg.hidden_size, experts=cfg.num_experts, top_k=cfg.num_experts_per_tok,
                   intermediate=cfg.moe_intermediate_size, shared_intermediate=cfg.shared_expert_intermediate_size)


def expected_distinct_experts(tokens: int, experts: int, top_k: int) -> float:
    """Experts that `tokens` tokens visit on average when each picks top_k distinct experts uniformly at random:
    E (1 - (1 - k/E)^T). A skewed router visits fewer (and reads fewer bytes)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def gdn_decode_bytes(batch: int, d: GDNDims, elem: int, state_elem: int) -> float:
    """One GDN layer, one token per sequence: every weight read once, the conv window (activation dtype) and the
    recurrent state (`state_elem`, float32) read and written back, x in and y out."""
    weights = ((d.conv_dim + d.value_dim + 2 * d.num_v_heads) * d.hidden_size  # in_proj_qkv, _z, _b, _a
               + d.conv_dim * d.conv_kernel + 2 * d.num_v_heads + d.head_v_dim  # conv1d, A_log, dt_bias, norm
               + d.hidden_size * d.value_dim)  # out_proj
    state = batch * (d.conv_dim * (d.conv_kernel - 1) * elem + d.num_v_heads * d.head_k_dim * d.head_v_dim * state_elem)
    return weights * elem + 2 * state + 2 * batch * d.hidden_size * elem


def attention_decode_bytes(batch: int, context: int, d: AttentionDims, elem: int) -> float:
    """One gated-attention layer, one token per sequence: every weight read once, K and V of all `context`
    positions read once (the new token's included), the new token's K and V written once, x in and y out."""
    q, kv = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
    weights = (2 * q + 2 * kv) * d.hidden_size + d.hidden_size * q + 2 * d.head_dim  # q(+gate), k, v, o, q/k norms
    cache = 2 * batch * kv * (context + 1)  # K and V: `context` positions read, the new one's written
    return (weights + cache + 2 * batch * d.hidden_size) * elem


def rms_norm_bytes(tokens: int, hidden: int, elem: int) -> float:
    return (hidden + 2 * tokens * hidden) * elem  # weight, x in, y out


def lm_head_bytes(tokens: int, vocab: int, hidden: int, elem: int) -> float:
    return (vocab * hidden + tokens * hidden + tokens * vocab) * elem  # weight, x in, logits out


def embed_bytes(tokens: int, hidden: int, elem: int) -> float:
    return 2 * tokens * hidden * elem + tokens * I64  # the rows read, h written, the ids


def dense_mlp_bytes(tokens: int, hidden: int, inter: int, elem: int) -> float:
    return (3 * inter * hidden + 2 * tokens * hidden) * elem


def decode_step_bytes(cfg: Qwen36Config, batch: int, context: int, elem: int, state_elem: int) -> dict[str, float]:
    """The least HBM traffic of one decode step of `batch` sequences that have seen `context` tokens (the new
    one included), per block kind of model.qwen36.model.TRACE_KINDS, summed over the layers of `cfg` (a
    per-rank config gives one rank's). The MoE block reads its router, shared expert and gate, and the
    experts `expected_distinct_experts` says the batch visits; the norms are the two per layer and the final
    one, each but the first with the residual add before it (q/k norms and the gated norm are counted in their
    mixer). No communication."""
    out: dict[str, float] = defaultdict(float)
    out["embed"] = embed_bytes(batch, cfg.hidden_size, elem)
    moe = moe_dims_of(cfg)
    for i, kind in enumerate(cfg.layer_types):
        if kind == "linear_attention":
            out["gdn"] += gdn_decode_bytes(batch, cfg.gdn_dims, elem, state_elem)
        else:
            out["attention"] += attention_decode_bytes(batch, context, cfg.attention_dims, elem)
        if cfg.is_moe_layer(i):
            distinct = expected_distinct_experts(batch, moe.experts, moe.top_k)
            out["moe"] += moe_block_work(batch, distinct, moe, elem).bytes
        else:
            out["mlp"] += dense_mlp_bytes(batch, cfg.hidden_size, cfg.intermediate_size, elem)
    out["norm"] = (rms_norm_bytes(batch, cfg.hidden_size, elem)
                   + 2 * cfg.num_hidden_layers * add_rms_norm_work(batch, cfg.hidden_size, elem).bytes)
    out["lm_head"] = lm_head_bytes(batch, cfg.vocab_size, cfg.hidden_size, elem)
    return dict(out)
