"""The staged GDN layer's conv and gated-norm sweeps: every available path of model.gdn.CONV_PATHS (block
`gdn_conv`, B = 1 and T tokens: the layer's q/k/v projection from a random conv state) and of
model.norm.rms_norm.GATED_NORM_PATHS (block `gdn_gated_norm`, keyed by rows: B * T tokens of HV heads), each checked
against its block's float64 reference (the conv's new state exactly, its initial state left alone).

These paths allocate their outputs (their calling convention has no `out`), so a row keeps what the last call
returned: the check reads it, and a CUDA graph's replay overwrites the outputs of its capture."""
from __future__ import annotations

from typing import Callable, Collection

import torch

from model import tolerances
from model.gdn import CONV_PATHS, GDNDims
from model.norm.rms_norm import GATED_NORM_PATHS

from ..measure.ceilings import Ceilings
from ..measure.floors import floor_of, gated_norm_work, gdn_conv_work
from ..measure.inputs import gated_norm_inputs, gdn_conv_inputs
from ..measure.point import Measurement, Settings, check_error, kept_outputs, measure, path_rows, tolerance_for
from . import vllm_own

__all__ = ["CONV_BLOCK", "NORM_BLOCK", "conv_points", "norm_points", "sweep_gdn_conv", "sweep_gated_norm",
           "unavailable_stage_paths"]

CONV_BLOCK, NORM_BLOCK = "gdn_conv", "gdn_gated_norm"
PathsAt = Callable[[str, int], "Collection[str] | None"]


def conv_points(prefill_tokens) -> tuple[int, ...]:
    """The conv's points: one token (a decode step of the staged layer) and the prefill token counts."""
    return tuple(sorted({1, *prefill_tokens}))


def norm_points(prefill_tokens, decode_batches) -> tuple[int, ...]:
    """The gated norm's rows: a prefill's tokens, or a decode step's sequences (one token each)."""
    return tuple(sorted({*prefill_tokens, *decode_batches}))


def unavailable_stage_paths(s: Settings) -> dict[str, str]:
    """"conv path X" / "gated norm path X" -> why it cannot run here, for the report's notes."""
    return {f"{what} {p.name}": why for what, table in (("conv path", CONV_PATHS), ("gated norm path", GATED_NORM_PATHS))
            for p in table.candidates() if (why := p.unavailable_reason(s.device, s.dtype))}


def _conv_point(tokens: int, d: GDNDims, s: Settings, ceilings: Ceilings, rows: list[Measurement],
                only: Collection[str] | None) -> None:
    x, weight, state = gdn_conv_inputs(1, tokens, d, s.dtype, s.device, seed=60_000 + tokens)
    ref_y, ref_state = CONV_PATHS.reference.fn(x.double(), weight.double(), state.double())
    ref_state = ref_state.to(state.dtype)
    floor = floor_of(gdn_conv_work(1, tokens, d, x.element_size()), ceilings)
    saved = state.clone()
    for path, m in path_rows(CONV_PATHS, CONV_BLOCK, tokens, tokens, only, s, tolerances.GDN_CONV_PATHS,
                             "GDN_CONV_PATHS", floor, {"batch": 1, "tokens": tokens}, rows):
        call, reset, kept = kept_outputs(lambda fn=path.fn: fn(x, weight, state))

        def check(kept=kept):
            if not torch.equal(state, saved):
                state.copy_(saved)
                return float("inf"), "modified its initial conv state"
            y, new_state = kept
            if not torch.equal(new_state, ref_state):
                return float("inf"), "its new state is not the last W-1 inputs"
            return check_error(y, ref_y), ""

        measure(m, call, reset, check, s)


def _norm_point(count: int, d: GDNDims, s: Settings, ceilings: Ceilings, rows: list[Measurement],
                only: Collection[str] | None) -> None:
    x, z, weight = gated_norm_inputs(count, d, s.dtype, s.device, seed=65_000 + count)
    ref = GATED_NORM_PATHS.reference.fn(x.double(), weight.double(), d.eps, z.double())
    floor = floor_of(gated_norm_work(count, d, x.element_size()), ceilings)
    for path, m in path_rows(GATED_NORM_PATHS, NORM_BLOCK, count, count, only, s, tolerances.NORM_PATHS,
                             "NORM_PATHS", floor, {"rows": count}, rows):
        call, reset, kept = kept_outputs(lambda fn=path.fn: fn(x, weight, d.eps, z))
        measure(m, call, reset, lambda kept=kept: (check_error(kept[0], ref), ""), s)
    if vllm_own.wanted(only):
        def build():
            fn = vllm_own.gated_norm(d.eps, weight, d.hidden_size)
            return lambda: fn(x, z)

        vllm_own.row(rows, NORM_BLOCK, count, "RMSNormGated", build, lambda kept: check_error(kept[0], ref), s, floor,
                     tolerance_for(tolerances.NORM_PATHS, vllm_own.VLLM, s), {"rows": count})


def sweep_gdn_conv(d: GDNDims, tokens, s: Settings, ceilings: Ceilings, tick: Callable[[str], None],
                   rows: list[Measurement] | None = None, paths_at: PathsAt | None = None) -> list[Measurement]:
    """Every conv path at each token count (B = 1). Appends to `rows` as it goes (a sweep stopped half way keeps
    what it measured); `paths_at(block, key)` names the paths to time at a point (None: every candidate)."""
    rows = [] if rows is None else rows
    for t in tokens:
        tick(f"gdn conv T={t}")
        _conv_point(t, d, s, ceilings, rows, paths_at(CONV_BLOCK, t) if paths_at else None)
    return rows


def sweep_gated_norm(d: GDNDims, counts, s: Settings, ceilings: Ceilings, tick: Callable[[str], None],
                     rows: list[Measurement] | None = None, paths_at: PathsAt | None = None) -> list[Measurement]:
    """Every gated-norm path at each row count, as `sweep_gdn_conv` does for the conv."""
    rows = [] if rows is None else rows
    for n in counts:
        tick(f"gdn gated norm rows={n}")
        _norm_point(n, d, s, ceilings, rows, paths_at(NORM_BLOCK, n) if paths_at else None)
    return rows
