"""Gated full attention of Qwen3.5/3.6 (and Qwen3-Next), with a KV cache for prefill over a cached prefix.

    [q | gate] per head = x @ q_proj^T      (head-major rows: head h owns [2D*h, 2D*h + D) q, then D gate rows)
    q = rope(q_norm(q)), k = rope(k_norm(x @ k_proj^T)), v = x @ v_proj^T      (zero-centred norms, partial RoPE)
    o = causal_softmax(q k^T / sqrt(D)) v       (GQA: query head h reads kv head h // (NH / NKV))
    y = (o * sigmoid(gate)) @ o_proj^T
A cached prefix of P tokens puts the new queries at positions P.. and lets them attend to all P cached keys.

Two caches: `KVCache` grows by torch.cat each call and takes positions from its length on the host (the
dynamic path); `StaticKVCache` is preallocated for `max_len` positions, written in place at a length held on
the device, and read whole under a mask (`gated_attention_static`): no host integer and no shape that changes
with the length, so one captured CUDA graph serves every length below max_len.

Attention cores (the softmax(q k^T) v part) are registered in `ATTENTION_CORES`, a model.dispatch.paths.PathTable:
`fn(q [B, NH, T, D], k [B, NKV, S, D], v [B, NKV, S, D], q_start, scale) -> [B, NH, T, D]` in q's dtype,
where query i sits at position q_start + i and key j at position j (S = q_start + T).
`MASKED_ATTENTION_CORES` holds the same cores with the mask given instead of q_start:
`fn(q, k, v, visible [T, S] bool, scale)`, for a mask computed on the device.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Mapping

import torch
import torch.nn.functional as F

from ..dispatch.paths import ComputePath, PathTable
from ..norm.rms_norm import RMS_NORM_PATHS, compute_dtype
from ..rows import moved_keeping_rows, stack_rows, stacked_rows
from .rope import apply_partial_rope, rope_cos_sin

__all__ = [
    "AttentionDims",
    "AttentionWeights",
    "KVCache",
    "StaticKVCache",
    "ATTENTION_CORES",
    "MASKED_ATTENTION_CORES",
    "attention_core_reference",
    "attention_core_sdpa",
    "gated_attention",
    "gated_attention_static",
    "ATTENTION_HF_NAMES",
]

QKV = ("q_proj", "k_proj", "v_proj")  # the projections the decode layer's single GEMM stacks, in its order
ATTENTION_HF_NAMES = {
    "q_proj": "q_proj.weight",
    "k_proj": "k_proj.weight",
    "v_proj": "v_proj.weight",
    "o_proj": "o_proj.weight",
    "q_norm": "q_norm.weight",
    "k_norm": "k_norm.weight",
}


@dataclass(frozen=True)
class AttentionDims:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads={self.num_kv_heads}"
            )
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(f"rotary_dim={self.rotary_dim} must be even and in (0, head_dim={self.head_dim}]")


@dataclass(frozen=True)
class AttentionWeights:
    q_proj: torch.Tensor  # [NH * 2D, hidden], per head [q | gate]
    k_proj: torch.Tensor  # [NKV * D, hidden]
    v_proj: torch.Tensor  # [NKV * D, hidden]
    o_proj: torch.Tensor  # [hidden, NH * D]
    q_norm: torch.Tensor  # [D], zero-centred
    k_norm: torch.Tensor  # [D], zero-centred
    dims: AttentionDims

    def __post_init__(self) -> None:
        d = self.dims
        expected = {
            "q_proj": (2 * d.num_heads * d.head_dim, d.hidden_size),
            "k_proj": (d.num_kv_heads * d.head_dim, d.hidden_size),
            "v_proj": (d.num_kv_heads * d.head_dim, d.hidden_size),
            "o_proj": (d.hidden_size, d.num_heads * d.head_dim),
            "q_norm": (d.head_dim,),
            "k_norm": (d.head_dim,),
        }
        for name, shape in expected.items():
            actual = tuple(getattr(self, name).shape)
            if actual != shape:
                hint = " (attention projections with a bias are not supported)" if name.endswith("proj") else ""
                raise ValueError(f"AttentionWeights.{name} has shape {actual}; expected {shape} for {d}{hint}")

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "dims"}

    def to(self, dtype: torch.dtype | None = None, device=None) -> "AttentionWeights":
        # q/k/v moved as one tensor when they are rows of one (see qkv_stacked).
        return replace(self, **moved_keeping_rows(self.tensors(), QKV, dtype, device))

    @classmethod
    def from_hf_state_dict(
        cls, state: Mapping[str, torch.Tensor], dims: AttentionDims, prefix: str = ""
    ) -> "AttentionWeights":
        missing = [prefix + key for key in ATTENTION_HF_NAMES.values() if prefix + key not in state]
        if missing:
            raise KeyError(f"attention state dict lacks {missing}; is {prefix!r} the right prefix?")
        if any(prefix + f"{p}.bias" in state for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
            raise ValueError(f"{prefix}: attention_bias=True checkpoints are not supported (Qwen3.5/3.6 has none)")
        tensors = {name: state[prefix + key] for name, key in ATTENTION_HF_NAMES.items()}
        # One tensor holds q/k/v (a second copy of them only while `state` lives), so the decode layer's stacked
        # GEMM weight is a view of it and costs no memory (qkv_stacked).
        tensors.update(zip(QKV, stack_rows(tuple(tensors[name] for name in QKV))))
        return cls(dims=dims, **tensors)

    def to_hf_state_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        return {prefix + key: getattr(self, name) for name, key in ATTENTION_HF_NAMES.items()}

    @functools.cached_property
    def qkv_stacked(self) -> torch.Tensor:
        """[q_proj; k_proj; v_proj], [NH*2D + 2*NKV*D, hidden]: the decode layer's one input GEMM
        (model.attention.decode_layer). Memory: none when the three are consecutive rows of one tensor, as
        `from_hf_state_dict` and `to` leave them (a view). Otherwise they are concatenated on first use and the
        copy is kept on this object (not seen by later in-place edits of the three): a second copy of the
        projections, (2048 + 2 * 256) * 2048 * 2 bytes = 10.5 MB per attention layer in bf16 at the per-rank
        dims of Qwen3.6 under TP=4 (NH 4, NKV 1, D 256)."""
        projections = tuple(getattr(self, name) for name in QKV)
        stacked = stacked_rows(projections)
        return torch.cat(projections) if stacked is None else stacked


@dataclass(frozen=True)
class KVCache:
    """Rotated keys and values of the tokens seen so far: [B, NKV, S, D] each, in the activation dtype."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[2]

    @classmethod
    def empty(cls, batch: int, dims: AttentionDims, dtype: torch.dtype, device=None) -> "KVCache":
        shape = (batch, dims.num_kv_heads, 0, dims.head_dim)
        return cls(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))


@dataclass(frozen=True)
class StaticKVCache:
    """Rotated keys and values in buffers of `max_len` positions, [B, NKV, max_len, D] each, written in place.

    `length` (int64, 0-dim, on the buffers' device) counts the tokens already cached; the model cache that owns
    it shares it between its attention layers and advances it after a step. Positions at or past `length` hold
    zeros or stale keys: they must stay finite (a masked key's probability is exactly 0, and 0 * NaN is NaN).
    """

    k: torch.Tensor
    v: torch.Tensor
    length: torch.Tensor

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @classmethod
    def holding(cls, cache: KVCache, max_len: int, length: torch.Tensor) -> "StaticKVCache":
        """Zeroed buffers of `max_len` positions, shaped and typed like `cache`, with its keys and values loaded."""
        batch, heads, _, head_dim = cache.k.shape
        shape = (batch, heads, max_len, head_dim)
        static = cls(cache.k.new_zeros(shape), cache.v.new_zeros(shape), length)
        static.load(cache)
        return static

    def load(self, cache: KVCache) -> None:
        """The first cache.length positions from a dynamic cache (a prefill's); `length` is the owner's to set."""
        if cache.k.shape[0] != self.k.shape[0] or cache.length > self.max_len:
            raise ValueError(f"a KV cache of {cache.k.shape[0]} sequences x {cache.length} tokens does not fit "
                             f"buffers of {self.k.shape[0]} x {self.max_len}")
        self.k[:, :, : cache.length].copy_(cache.k)
        self.v[:, :, : cache.length].copy_(cache.v)


def _causal_mask(q_start: int, tokens: int, keys: int, device) -> torch.Tensor:
    """True where query i (position q_start + i) may see key j: j <= q_start + i."""
    query_pos = torch.arange(q_start, q_start + tokens, device=device)[:, None]
    return torch.arange(keys, device=device)[None, :] <= query_pos


def _expand_kv(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    # Query head h reads kv head h // group: repeat_interleave (HF's repeat_kv), not repeat.
    return t.repeat_interleave(num_heads // t.shape[1], dim=1)


def _visible_keys(query_positions: torch.Tensor, keys: int) -> torch.Tensor:
    """[T, keys] bool: key j is visible to the query at query_positions[i] when j <= that position. Built on
    the positions' device from a device tensor: no host integer."""
    return torch.arange(keys, device=query_positions.device)[None, :] <= query_positions[:, None]


def attention_core_reference(q, k, v, q_start, scale):
    """Written out: scores, masked fill, softmax, weighted sum, in float32 (float64 for float64 input)."""
    return masked_attention_reference(q, k, v, _causal_mask(q_start, q.shape[2], k.shape[2], q.device), scale)


def masked_attention_reference(q, k, v, visible, scale):
    """attention_core_reference with the mask given."""
    ct = compute_dtype(q.dtype)
    k, v = _expand_kv(k.to(ct), q.shape[1]), _expand_kv(v.to(ct), q.shape[1])
    scores = (q.to(ct) @ k.transpose(-1, -2)) * scale
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return (probs @ v).to(q.dtype)


def attention_core_sdpa(q, k, v, q_start, scale):
    """`F.scaled_dot_product_attention` with a boolean prefix-causal mask (the PREFIX attention shape)."""
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    if q_start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    mask = _causal_mask(q_start, q.shape[2], k.shape[2], q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def masked_attention_sdpa(q, k, v, visible, scale):
    """`F.scaled_dot_product_attention` with the mask given."""
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)


# Outputs are in q's dtype.
ATTENTION_CORES = PathTable("attention core", [
    ComputePath("reference", attention_core_reference, "scores, mask, softmax, sum, written out", is_reference=True),
    ComputePath("sdpa", attention_core_sdpa, "F.scaled_dot_product_attention, prefix-causal mask"),
])
# The static cache's cores, by the name of the ATTENTION_CORES entry they mirror (the core a Qwen36Paths names).
MASKED_ATTENTION_CORES = {"reference": masked_attention_reference, "sdpa": masked_attention_sdpa}


def _check_input(x: torch.Tensor, d: AttentionDims) -> None:
    if x.dim() != 3 or x.shape[-1] != d.hidden_size:
        raise ValueError(f"attention input has shape {tuple(x.shape)}; expected [B, T, {d.hidden_size}]")


def _check_batch(x: torch.Tensor, cached: torch.Tensor) -> None:
    if cached.shape[0] != x.shape[0]:
        raise ValueError(f"the KV cache holds {cached.shape[0]} sequences but the input has {x.shape[0]}")


def _rotated_qkv_gate(x: torch.Tensor, w: AttentionWeights, positions: torch.Tensor, norm: str):
    """q [B, NH, T, D] and k [B, NKV, T, D] normed and rotated at `positions` [T], v [B, NKV, T, D], gate."""
    d = w.dims
    batch, tokens, _ = x.shape
    rms = RMS_NORM_PATHS[norm].fn
    q, gate = F.linear(x, w.q_proj).view(batch, tokens, d.num_heads, 2 * d.head_dim).chunk(2, dim=-1)
    q = rms(q, w.q_norm, d.eps).transpose(1, 2)
    k = rms(F.linear(x, w.k_proj).view(batch, tokens, d.num_kv_heads, d.head_dim), w.k_norm, d.eps).transpose(1, 2)
    v = F.linear(x, w.v_proj).view(batch, tokens, d.num_kv_heads, d.head_dim).transpose(1, 2)
    cos, sin = rope_cos_sin(positions, d.rotary_dim, d.rope_theta, x.dtype)
    return apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin), v, gate


def _gated_output(o: torch.Tensor, gate: torch.Tensor, w: AttentionWeights) -> torch.Tensor:
    batch, _, tokens, _ = o.shape
    o = o.transpose(1, 2).reshape(batch, tokens, w.dims.num_heads * w.dims.head_dim)
    o = o * torch.sigmoid(gate.reshape(batch, tokens, -1))
    return F.linear(o, w.o_proj)


def gated_attention(
    x: torch.Tensor,
    w: AttentionWeights,
    cache: KVCache | None = None,
    *,
    core: str = "sdpa",
    norm: str = "fused",
) -> tuple[torch.Tensor, KVCache]:
    """y [B, T, hidden] in x's dtype for T new tokens after `cache` (None: a fresh sequence), and the cache
    extended by them."""
    d = w.dims
    _check_input(x, d)
    if cache is None:
        cache = KVCache.empty(x.shape[0], d, x.dtype, x.device)
    _check_batch(x, cache.k)
    tokens = x.shape[1]
    start = cache.length
    q, k, v, gate = _rotated_qkv_gate(x, w, torch.arange(start, start + tokens, device=x.device), norm)
    new_cache = KVCache(torch.cat([cache.k, k.to(cache.k.dtype)], dim=2), torch.cat([cache.v, v.to(cache.v.dtype)], dim=2))
    o = ATTENTION_CORES[core].fn(q, new_cache.k, new_cache.v, start, d.head_dim**-0.5)
    return _gated_output(o, gate, w), new_cache


def gated_attention_static(
    x: torch.Tensor,
    w: AttentionWeights,
    cache: StaticKVCache,
    *,
    core: str = "sdpa",
    norm: str = "fused",
) -> tuple[torch.Tensor, StaticKVCache]:
    """gated_attention over a StaticKVCache: the new tokens' keys and values are written into its buffers at
    positions cache.length.. (cache.length is left for the owner to advance), and the queries attend over all
    max_len positions with keys past their own position masked out.

    The same function as gated_attention and the same keys and values written, bit for bit, but not the same
    output bits: the core reduces over max_len keys where the dynamic one reduces over cache.length + T, and how
    a kernel associates that sum depends on the key count. On the CPU, SDPA's flash kernel
    (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp) cuts the keys into blocks sized from the key count and
    sums exp(score - max) over a block in vector lanes plus a scalar tail (_exp_reduce_sum_fusion_kernel), so
    with more keys the visible terms land in other lanes and blocks; the masked terms add exact zeros and the max
    is exact, so the difference is rounding only (measured: a few ulp, float32 and float64). The outputs agree to
    model.tolerances.ATTENTION_CORES (tests/numerics/test_qwen36_static_decode.py)."""
    d = w.dims
    _check_input(x, d)
    _check_batch(x, cache.k)
    if core not in MASKED_ATTENTION_CORES:
        raise ValueError(f"no masked form of attention core {core!r} for a static KV cache; "
                         f"choose one of {', '.join(sorted(MASKED_ATTENTION_CORES))}")
    positions = cache.length + torch.arange(x.shape[1], device=x.device)  # on the device: no host integer
    q, k, v, gate = _rotated_qkv_gate(x, w, positions, norm)
    cache.k.index_copy_(2, positions, k.to(cache.k.dtype))
    cache.v.index_copy_(2, positions, v.to(cache.v.dtype))
    o = MASKED_ATTENTION_CORES[core](q, cache.k, cache.v, _visible_keys(positions, cache.max_len), d.head_dim**-0.5)
    return _gated_output(o, gate, w), cache
