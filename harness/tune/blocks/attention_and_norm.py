"""The decode step's blocks outside the MoE block and the GDN layer: the full-attention layer at one token per
sequence (model.attention.decode_layer.ATTENTION_DECODE_LAYER_PATHS, block `attention_layer_decode`, keyed by the batch,
over ATTENTION_CONTEXT cached keys of a static KV cache) and the residual add + zero-centred RMSNorm between
blocks (model.norm.rms_norm.ADD_RMS_NORM_PATHS, block `add_rms_norm`, keyed by rows: B * T tokens). Each path is checked
against its block's float64 reference; the attention layer's key and value written at the cache's length too, and
nothing else in the cache changed.

The paths allocate their outputs, so a row keeps what the last call returned (harness/tune/blocks/gdn_stages.py says
why).
"""
from __future__ import annotations

from typing import Callable, Collection

import torch

from model import tolerances
from model.attention.decode_layer import ATTENTION_DECODE_LAYER_PATHS
from model.attention.layer import AttentionDims, StaticKVCache
from model.norm.rms_norm import ADD_RMS_NORM_PATHS

from ..measure.ceilings import Ceilings
from ..measure.floors import add_rms_norm_work, attention_decode_work, floor_of
from ..measure.inputs import NORM_SCALE, _randn, attention_weights, generator
from ..measure.point import Measurement, Settings, check_error, kept_outputs, measure, path_rows, tolerance_for
from . import vllm_own

__all__ = ["ATTENTION_BLOCK", "ADD_NORM_BLOCK", "sweep_attention_layer", "sweep_add_rms_norm",
           "unavailable_step_block_paths"]

ATTENTION_BLOCK, ADD_NORM_BLOCK = "attention_layer_decode", "add_rms_norm"
PathsAt = Callable[[str, int], "Collection[str] | None"]
_ROOM = 8  # cache positions past the context: the one written, and stale ones the mask must hide


def unavailable_step_block_paths(s: Settings) -> dict[str, str]:
    """"attention decode layer path X" / "add + RMSNorm path X" -> why it cannot run here, for the report's notes."""
    tables = (("attention decode layer path", ATTENTION_DECODE_LAYER_PATHS), ("add + RMSNorm path", ADD_RMS_NORM_PATHS))
    return {f"{what} {p.name}": why for what, table in tables
            for p in table.candidates() if (why := p.unavailable_reason(s.device, s.dtype))}


def _attention_inputs(batch: int, context: int, d: AttentionDims, s: Settings, seed: int):
    """x [B, 1, hidden] and a static cache holding random keys and values at every position (those at and past
    `context` are stale: the layer must neither read them nor change any but position `context`)."""
    gen = generator(s.device, seed)
    x = _randn(gen, (batch, 1, d.hidden_size), s.device, s.dtype)
    shape = (batch, d.num_kv_heads, context + _ROOM, d.head_dim)
    k, v = (_randn(gen, shape, s.device, s.dtype) for _ in range(2))
    return x, StaticKVCache(k, v, torch.tensor(context, dtype=torch.int64, device=s.device))


def _attention_point(batch: int, context: int, w, s: Settings, ceilings: Ceilings, rows: list[Measurement],
                     only: Collection[str] | None) -> None:
    d = w.dims
    x, cache = _attention_inputs(batch, context, d, s, seed=70_000 + batch)
    saved_k, saved_v = cache.k.clone(), cache.v.clone()
    ref_cache = StaticKVCache(cache.k.clone(), cache.v.clone(), cache.length.clone())
    ref = ATTENTION_DECODE_LAYER_PATHS.reference.fn(x, w, ref_cache)
    floor = floor_of(attention_decode_work(batch, context, d, x.element_size()), ceilings)
    for path, m in path_rows(ATTENTION_DECODE_LAYER_PATHS, ATTENTION_BLOCK, batch, 1, only, s,
                             tolerances.ATTENTION_DECODE_LAYER, "ATTENTION_DECODE_LAYER", floor,
                             {"batch": batch, "context": context}, rows):
        cache_bound = tolerance_for(tolerances.ATTENTION_DECODE_LAYER_CACHE, path.name, s)
        if cache_bound is None:
            m.bound, m.detail = None, (f"no {s.dtype} tolerance for the key and value {path.name!r} writes in "
                                       "model/tolerances.py (ATTENTION_DECODE_LAYER_CACHE)")
            continue
        call, reset_outputs, kept = kept_outputs(lambda fn=path.fn: fn(x, w, cache))

        def reset(reset_outputs=reset_outputs):
            reset_outputs()
            cache.k.copy_(saved_k)  # the written position stale again: a call that does not write it is caught
            cache.v.copy_(saved_v)

        def check(kept=kept, cache_bound=cache_bound):
            written = (cache.k[:, :, context].clone(), cache.v[:, :, context].clone())
            cache.k[:, :, context], cache.v[:, :, context] = saved_k[:, :, context], saved_v[:, :, context]
            elsewhere = torch.equal(cache.k, saved_k) and torch.equal(cache.v, saved_v)
            cache.k.copy_(saved_k)
            cache.v.copy_(saved_v)
            if not elsewhere:
                return float("inf"), "changed the cache at a position other than its length"
            written_err = max(check_error(written[0], ref_cache.k[:, :, context]),
                              check_error(written[1], ref_cache.v[:, :, context]))
            if not written_err <= cache_bound:
                return float("inf"), (f"wrote the key and value at the length off by {written_err:.2e} "
                                      f"(> {cache_bound:.0e})")
            return check_error(kept[0], ref), ""

        measure(m, call, reset, check, s)


def _add_norm_point(count: int, hidden: int, eps: float, s: Settings, ceilings: Ceilings, rows: list[Measurement],
                    only: Collection[str] | None) -> None:
    gen = generator(s.device, 75_000 + count)
    h, y = (_randn(gen, (count, hidden), s.device, s.dtype) for _ in range(2))
    weight = _randn(gen, (hidden,), s.device, s.dtype, NORM_SCALE)
    ref_sum, ref_normed = ADD_RMS_NORM_PATHS.reference.fn(h.double(), y.double(), weight.double(), eps)
    floor = floor_of(add_rms_norm_work(count, hidden, h.element_size()), ceilings)
    for path, m in path_rows(ADD_RMS_NORM_PATHS, ADD_NORM_BLOCK, count, count, only, s, tolerances.ADD_NORM_PATHS,
                             "ADD_NORM_PATHS", floor, {"rows": count}, rows):
        call, reset, kept = kept_outputs(lambda fn=path.fn: fn(h, y, weight, eps))

        def check(kept=kept):
            return max(check_error(kept[0], ref_sum), check_error(kept[1], ref_normed)), ""

        measure(m, call, reset, check, s)
    if vllm_own.wanted(only):
        def build():
            fn = vllm_own.add_rms_norm(hidden, eps, weight)
            return lambda: fn(h, y)

        vllm_own.row(rows, ADD_NORM_BLOCK, count, "GemmaRMSNorm", build,
                     lambda kept: max(check_error(kept[0], ref_sum), check_error(kept[1], ref_normed)), s, floor,
                     tolerance_for(tolerances.ADD_NORM_PATHS, vllm_own.VLLM, s), {"rows": count})


def sweep_attention_layer(d: AttentionDims, batches, context: int, s: Settings, ceilings: Ceilings,
                          tick: Callable[[str], None], rows: list[Measurement] | None = None,
                          paths_at: PathsAt | None = None) -> list[Measurement]:
    """Every attention decode-layer path at each batch, over `context` cached keys. Appends to `rows` as it goes
    (a sweep stopped half way keeps what it measured); `paths_at(block, key)` names the paths to time at a point
    (None: every candidate)."""
    rows = [] if rows is None else rows
    w = attention_weights(d, s.dtype, s.device)
    for b in batches:
        tick(f"attention decode layer B={b}")
        _attention_point(b, context, w, s, ceilings, rows, paths_at(ATTENTION_BLOCK, b) if paths_at else None)
    return rows


def sweep_add_rms_norm(hidden: int, eps: float, counts, s: Settings, ceilings: Ceilings,
                       tick: Callable[[str], None], rows: list[Measurement] | None = None,
                       paths_at: PathsAt | None = None) -> list[Measurement]:
    """Every residual add + RMSNorm path at each row count, as `sweep_attention_layer` does for the attention."""
    rows = [] if rows is None else rows
    for n in counts:
        tick(f"add + rms norm rows={n}")
        _add_norm_point(n, hidden, eps, s, ceilings, rows, paths_at(ADD_NORM_BLOCK, n) if paths_at else None)
    return rows
