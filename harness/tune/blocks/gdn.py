"""The GDN sweeps: every available path of model.gdn.GDN_RULE_PATHS for prefill (B = 1, T tokens) and for
one decode step (T = 1, B sequences), each from a random float32 state, checked (output and final state,
initial state left alone) against the float64 recurrent reference on the same inputs upcast."""
from __future__ import annotations

from typing import Callable, Collection

import torch

from model.gdn import GDN_RULE_PATHS, GDNDims, run_gdn_rule

from model import tolerances
from ..measure.ceilings import Ceilings
from ..measure.floors import floor_of, gdn_rule_work
from ..measure.inputs import gdn_rule_inputs
from ..measure.point import Measurement, Settings, check_error, measure
from ..measure.prune import Pruner

__all__ = ["sweep_gdn", "unavailable_rule_paths"]


def unavailable_rule_paths(s: Settings) -> dict[str, str]:
    out = {}
    for path in GDN_RULE_PATHS.candidates():
        why = path.unavailable_reason(s.device, s.dtype)
        if why:
            out[path.name] = why
    return out


def _tolerance(name: str, s: Settings) -> float | None:
    try:
        return tolerances.gdn_rule_tolerance(name, s.dtype)
    except KeyError:
        return None


def _point(block: str, batch: int, tokens: int, d: GDNDims, s: Settings, ceilings: Ceilings, pruner: Pruner,
           seed: int, out_rows: list[Measurement], paths_at=None) -> None:
    key = batch if block == "gdn_decode" else tokens
    only = paths_at(block, key) if paths_at else None
    q, k, v, g, beta, state = gdn_rule_inputs(batch, tokens, d, s.dtype, s.device, seed)
    ref_out, ref_state = run_gdn_rule(GDN_RULE_PATHS.reference.name, q.double(), k.double(), v.double(), g.double(),
                                      beta.double(), state.double())
    floor = floor_of(gdn_rule_work(batch, tokens, d, v.element_size()), ceilings)
    saved = state.clone()
    rows = []
    for path in GDN_RULE_PATHS.candidates():
        name = path.name
        if only is not None and name not in only:
            continue
        if not pruner.keeps(name, key) or not path.supports(tokens, s.dtype, s.device):
            continue
        m = Measurement(block, key, name, "error", floor=floor, bound=_tolerance(name, s),
                        extra={"batch": batch, "tokens": tokens})
        if m.bound is None:
            m.detail = f"no {s.dtype} tolerance for {name!r} in model/tolerances.py"
            rows.append(m)
            out_rows.append(m)
            continue
        out = torch.empty(v.shape, dtype=s.dtype, device=s.device)
        final = torch.empty(state.shape, dtype=path.state_dtype(s.dtype), device=s.device)

        def reset(out=out, final=final):
            out.fill_(float("nan"))
            final.fill_(float("nan"))

        def check(out=out, final=final):
            if not torch.equal(state, saved):
                state.copy_(saved)
                return float("inf"), "modified its initial_state"
            return max(check_error(out, ref_out), check_error(final, ref_state)), ""

        rows.append(m)
        out_rows.append(measure(m, lambda fn=path.fn, out=out, final=final: fn(q, k, v, g, beta, state, out, final),
                                reset, check, s))
    pruner.update(rows)


def sweep_gdn(d: GDNDims, prefill_tokens, decode_batches, s: Settings, ceilings: Ceilings, pruner: Pruner,
              tick: Callable[[str], None], rows: list[Measurement] | None = None,
              paths_at: Callable[[str, int], "Collection[str] | None"] | None = None) -> list[Measurement]:
    """Appends to `rows` as it goes (a sweep stopped half way keeps what it measured). `paths_at(block, key)`
    names the paths to time at a point (None: every candidate)."""
    rows = [] if rows is None else rows
    for tokens in prefill_tokens:
        tick(f"gdn prefill T={tokens}")
        _point("gdn_prefill", 1, tokens, d, s, ceilings, pruner, tokens, rows, paths_at)
    decode_pruner = Pruner(pruner.factor, pruner.prefer_graph)  # decode is its own race
    for batch in decode_batches:
        tick(f"gdn decode B={batch}")
        _point("gdn_decode", batch, 1, d, s, ceilings, decode_pruner, 50_000 + batch, rows, paths_at)
    pruner.dropped.update({f"{p} (decode)": why for p, why in decode_pruner.dropped.items()})  # for the report
    return rows
