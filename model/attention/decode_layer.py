"""The gated attention layer for one token over a StaticKVCache (T == 1, the decode step), as a table of
whole-layer paths.

At decode the layer moves little data and its cost is kernel launches (eagerly ~20-30 us of host time each): the
staged layer (model.attention.layer.gated_attention_static) launches ~60 (q/k norms, rope cos/sin, cats, index_copy,
masks, repeat_interleave, SDPA, sigmoid ...). A path here computes the whole layer, so it can fuse across them.

Calling convention: `fn(x [B, 1, hidden], w: AttentionWeights, cache: StaticKVCache) -> y [B, 1, hidden]`, y in
x's dtype (the reference's in float64). The path writes the token's rotated key and its value into cache.k and
cache.v at position cache.length (a 0-dim int64 tensor on the device, which the cache's owner advances after the
step; no path changes it) and attends over positions 0..cache.length inclusive. Nothing else in the cache changes.

- `reference`: every block's reference path in float64 on the upcast inputs (the definition): gated_attention_static
  with the reference core and norms over a float64 copy of the cache, whose new key and value are then written
  into the cache in its dtype. So the reference attends to the new key and value unrounded, where the other
  paths attend to them as the cache stores them (a difference of the cache dtype's rounding);
- `staged`: gated_attention_static(x, w, cache, core="sdpa", norm="fused"), what the model ran before this table,
  bit for bit;
- `triton`: three launches: one GEMM for the stacked q/k/v projections (`AttentionWeights.qkv_stacked`), one
  Triton kernel for the norms, rope, cache write, attention and gate (model.attention.triton_decode_layer, float32 on
  chip), and o_proj. CUDA, or a CPU through Triton's interpreter (TRITON_INTERPRET=1). Its first call builds a
  rope table: make it eagerly, before capturing the step in a CUDA graph.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dispatch import triton_support
from ..dispatch.paths import LOW_PRECISION, ComputePath, PathTable, always_float64, same_as_input
from ..dispatch.scope import scoped
from ..dispatch.table import served_path
from ..norm.rms_norm import RMS_NORM_PATHS
from .layer import ATTENTION_CORES, AttentionWeights, StaticKVCache, gated_attention_static

attention_triton_decode = triton_support.import_if_triton(".triton_decode_layer", __package__)  # None: no Triton

__all__ = [
    "ATTENTION_DECODE_LAYER_PATHS",
    "attention_decode_reference",
    "attention_decode_staged",
    "attention_decode_triton",
    "attention_static",
    "fused_attention_layer",
    "run_attention_decode_layer",
    "select_attention_decode_layer_path",
    "served_attention_decode_layer",
]


def attention_decode_reference(x: torch.Tensor, w: AttentionWeights, cache: StaticKVCache) -> torch.Tensor:
    """The definition: the reference core and norms in float64 on the upcast inputs, over a float64 copy of the
    cache; the new key and value go into `cache` rounded to its dtype."""
    f64 = torch.float64
    scratch = StaticKVCache(cache.k.to(f64, copy=True), cache.v.to(f64, copy=True), cache.length)
    y, _ = gated_attention_static(x.to(f64), w.to(f64), scratch,
                                  core=ATTENTION_CORES.reference.name, norm=RMS_NORM_PATHS.reference.name)
    at = cache.length.reshape(1)  # on the device: no host integer
    cache.k.index_copy_(2, at, scratch.k.index_select(2, at).to(cache.k.dtype))
    cache.v.index_copy_(2, at, scratch.v.index_select(2, at).to(cache.v.dtype))
    return y


def attention_decode_staged(x: torch.Tensor, w: AttentionWeights, cache: StaticKVCache) -> torch.Tensor:
    """What the model ran before this table: the static layer with the SDPA core and the fused norms."""
    return gated_attention_static(x, w, cache, core="sdpa", norm="fused")[0]


def fused_attention_layer(x: torch.Tensor, w: AttentionWeights, cache: StaticKVCache, core) -> torch.Tensor:
    """The stacked q/k/v GEMM, `core` (the fused kernel's launcher, attention_triton_decode.attention_decode_core's
    signature), then o_proj: three launches. Tests hand it deliberately broken kernels."""
    batch = x.shape[0]
    proj = F.linear(x.reshape(batch, -1), w.qkv_stacked)
    return F.linear(core(proj, w, cache), w.o_proj).view(batch, 1, -1)


def attention_decode_triton(x: torch.Tensor, w: AttentionWeights, cache: StaticKVCache) -> torch.Tensor:
    if attention_triton_decode is None:
        raise RuntimeError("the 'triton' attention decode layer needs Triton, which is not installed; use 'staged'")
    return fused_attention_layer(x, w, cache, attention_triton_decode.attention_decode_core)


def triton_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    return triton_support.unavailable_reason(
        device, None if attention_triton_decode is None else attention_triton_decode.INTERPRETED
    )


# Tests iterate this table: a path is tested the moment it is registered (tolerances: model.tolerances). The KV
# cache a caller allocates is in the activation dtype (state_dtype_rule); the reference writes into whatever
# cache it is given, in that cache's dtype.
ATTENTION_DECODE_LAYER_PATHS = PathTable("attention decode layer path", [
    ComputePath("reference", attention_decode_reference, "every block's reference path, float64", max_tokens=1,
                is_reference=True, output_dtype_rule=always_float64, state_dtype_rule=same_as_input),
    ComputePath("staged", attention_decode_staged, "gated_attention_static, SDPA core, fused norms (~60 launches)",
                max_tokens=1, state_dtype_rule=same_as_input),
    ComputePath("triton", attention_decode_triton, "stacked q/k/v GEMM, one Triton kernel, o_proj (3 launches)",
                max_tokens=1, dtypes=LOW_PRECISION, why_unavailable=triton_unavailable_reason,
                state_dtype_rule=same_as_input),
])


@scoped
def select_attention_decode_layer_path(
    batch: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> str:
    """The serving choice: the device's dispatch table entry for `attention_layer_decode` at this batch where it
    names a path that can run, else `staged` (what the model ran before this table)."""
    return served_path(ATTENTION_DECODE_LAYER_PATHS, "attention_layer_decode", batch, 1, device, dtype, "staged")


def _check_shapes(x: torch.Tensor, w: AttentionWeights, cache: StaticKVCache) -> None:
    d = w.dims
    if x.dim() != 3 or x.shape[1] != 1 or x.shape[2] != d.hidden_size:
        raise ValueError(f"the attention decode layer takes one token: x has shape {tuple(x.shape)}, expected "
                         f"[B, 1, {d.hidden_size}] (gated_attention_static takes T > 1)")
    batch = x.shape[0]
    k, v = cache.k, cache.v
    if k.dim() != 4 or tuple(k.shape[:2]) != (batch, d.num_kv_heads) or k.shape[3] != d.head_dim or v.shape != k.shape:
        raise ValueError(f"the KV cache has k {tuple(k.shape)} and v {tuple(v.shape)}; expected [B={batch}, "
                         f"NKV={d.num_kv_heads}, max_len, D={d.head_dim}] each: a StaticKVCache for this batch "
                         "(StaticKVCache.holding)")
    length = cache.length
    if length.dim() != 0 or length.dtype != torch.int64 or length.device != k.device:
        raise ValueError(f"cache.length must be a 0-dim int64 tensor on the cache's device {k.device}; it is "
                         f"{length.dtype} of shape {tuple(length.shape)} on {length.device}")


def run_attention_decode_layer(name: str, x: torch.Tensor, w: AttentionWeights, cache: StaticKVCache) -> torch.Tensor:
    """Run a registered path by name, after checking shapes and that it can run this input."""
    _check_shapes(x, w, cache)
    return ATTENTION_DECODE_LAYER_PATHS.checked(name, 1, x.dtype, x.device).fn(x, w, cache)


def served_attention_decode_layer(
    batch: int,
    device: torch.device | str,
    dtype: torch.dtype,
    *,
    core: str | None = None,
    norm: str | None = None,
    decode_layer: str | None = None,
) -> str | None:
    """The whole-layer path (ATTENTION_DECODE_LAYER_PATHS) a one-token attention_static call runs with these
    arguments, or None when a forced core or norm keeps it on gated_attention_static with those paths."""
    if core is not None or norm is not None:
        return None
    return decode_layer or select_attention_decode_layer_path(batch, device, dtype)


def attention_static(
    x: torch.Tensor,
    w: AttentionWeights,
    cache: StaticKVCache,
    *,
    core: str | None = None,
    norm: str | None = None,
    decode_layer: str | None = None,
) -> tuple[torch.Tensor, StaticKVCache]:
    """gated_attention_static's contract (y [B, T, hidden] in x's dtype, the cache written at cache.length..,
    the length left to the owner) with each choice served: one token with no core or norm forced runs a
    whole-layer path, `decode_layer` or `select_attention_decode_layer_path` (the device's dispatch table, else
    `staged`, which is gated_attention_static(core="sdpa", norm="fused") bit for bit); otherwise
    gated_attention_static with the forced core and norm (default `sdpa` and `fused`)."""
    tokens = x.shape[1] if x.dim() == 3 else None
    name = served_attention_decode_layer(x.shape[0], x.device, x.dtype, core=core, norm=norm,
                                         decode_layer=decode_layer) if tokens == 1 else None
    if name is not None:
        return run_attention_decode_layer(name, x, w, cache), cache
    if decode_layer is not None:
        raise ValueError(f"decode_layer={decode_layer!r} replaces the whole attention layer for one token; it cannot "
                         f"combine with T={tokens} or a forced core/norm path (core={core!r}, norm={norm!r})")
    return gated_attention_static(x, w, cache, core=core or "sdpa", norm=norm or "fused")
