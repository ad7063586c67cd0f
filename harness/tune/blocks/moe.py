"""The MoE sweeps: every available path of model.moe.EXPERT_PATHS at each token count (routed experts alone),
the whole block at a few counts (composed: router, routed experts on each path, sigmoid-gated shared expert;
and every fused block path), and every router of model.moe.ROUTERS (the routing alone)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Collection

import torch
import torch.nn.functional as F

from model.moe import (EXPERT_PATHS, MOE_BLOCK_PATHS, ROUTERS, MoEConfig, MoEWeights, moe_block_reference,
                       route_reference, shared_expert)
from model.moe.experts import experts_magnitude

from model import tolerances
from ..measure.ceilings import Ceilings
from ..measure.dims import MoEDims
from ..measure.floors import Floor, floor_of, moe_block_work, moe_experts_work
from ..measure.inputs import moe_hidden, moe_routing, moe_weights
from ..measure.point import Measurement, Settings, check_error, measure
from ..measure.prune import Pruner
from ..table.block_rows import fused_block_paths
from . import vllm_own

__all__ = ["ExpertPoint", "expert_point", "graphed_block_tokens", "measure_expert_fn", "sweep_moe_experts",
           "sweep_moe_block", "sweep_graphed_block", "sweep_moe_router", "unavailable_expert_paths"]


def unavailable_expert_paths(s: Settings) -> dict[str, str]:
    return {p.name: f"unavailable for {s.dtype} on {s.device}" for p in EXPERT_PATHS.candidates()
            if not any(p.supports(t, s.dtype, s.device) for t in (p.min_tokens, 1, 64))}


# A sweep's filter: tokens -> the path names to time there (None: every candidate), e.g. the table's own path
# for the GPU perf gate's routine check.
PathsAt = Callable[[int], "Collection[str] | None"]


def _candidates(tokens: int, s: Settings, pruner: Pruner, paths_at: PathsAt | None = None):
    only = paths_at(tokens) if paths_at else None
    for path in EXPERT_PATHS.candidates():
        if only is not None and path.name not in only:
            continue
        if pruner.keeps(path.name, tokens) and path.supports(tokens, s.dtype, s.device):
            yield path.name, path


def _tolerance(block_or_path: str, s: Settings) -> float | None:
    try:
        if block_or_path == "block":
            return tolerances.MOE_BLOCK[s.dtype]
        return tolerances.expert_path_tolerance(block_or_path, s.dtype)
    except KeyError:
        return None


@dataclass(frozen=True)
class ExpertPoint:
    """One token count's inputs, their float64 output and floor: shared by every path (or config) timed there."""
    tokens: int
    x: torch.Tensor
    weights: torch.Tensor
    ids: torch.Tensor
    ref: torch.Tensor
    scale: float  # the size of the terms the experts sum: errors are measured against it, as the suite does
    distinct: int
    floor: Floor


def expert_point(d: MoEDims, tokens: int, s: Settings, ceilings: Ceilings, w: MoEWeights) -> ExpertPoint:
    x = moe_hidden(tokens, d, s.dtype, s.device, seed=tokens)
    weights, ids = moe_routing(x, w)
    reference = EXPERT_PATHS.reference
    ref = reference.fn(x, w.w13, w.w2, weights, ids,
                       torch.empty(x.shape, dtype=reference.output_dtype(s.dtype), device=s.device))
    distinct = int(ids.unique().numel())
    floor = floor_of(moe_experts_work(tokens, distinct, d, x.element_size()), ceilings)
    scale = experts_magnitude(x, w.w13, w.w2, weights, ids)
    return ExpertPoint(tokens, x, weights, ids, ref, scale, distinct, floor)


def measure_expert_fn(block: str, name: str, bound_of: str, fn: Callable, p: ExpertPoint, w: MoEWeights,
                      s: Settings) -> Measurement:
    """fn(x, w13, w2, weights, ids, out) at this point, checked against the bound of expert path `bound_of`."""
    m = Measurement(block, p.tokens, name, "error", floor=p.floor, extra={"distinct_experts": p.distinct})
    m.bound = _tolerance(bound_of, s)
    if m.bound is None:
        m.detail = f"no {s.dtype} tolerance for {bound_of!r} in model/tolerances.py"
        return m
    out = torch.empty(p.x.shape, dtype=s.dtype, device=s.device)
    return measure(m, lambda: fn(p.x, w.w13, w.w2, p.weights, p.ids, out), lambda: out.fill_(float("nan")),
                   lambda: (check_error(out, p.ref, p.scale), ""), s)


def sweep_moe_experts(d: MoEDims, tokens_list, s: Settings, ceilings: Ceilings, pruner: Pruner,
                      tick: Callable[[str], None], w: MoEWeights | None = None,
                      rows: list[Measurement] | None = None, paths_at: PathsAt | None = None) -> list[Measurement]:
    """Appends to `rows` as it goes (a sweep stopped half way keeps what it measured)."""
    w = w or moe_weights(d, s.dtype, s.device)
    rows = [] if rows is None else rows
    for tokens in tokens_list:
        tick(f"moe T={tokens}")
        p = expert_point(d, tokens, s, ceilings, w)
        here = []
        for name, path in _candidates(tokens, s, pruner, paths_at):
            here.append(measure_expert_fn("moe_experts", name, name, path.fn, p, w, s))
            rows.append(here[-1])
        pruner.update(here)
    return rows


def sweep_moe_block(d: MoEDims, tokens_list, s: Settings, ceilings: Ceilings, pruner: Pruner,
                    tick: Callable[[str], None], w: MoEWeights | None = None,
                    rows: list[Measurement] | None = None, paths_at: PathsAt | None = None) -> list[Measurement]:
    """The block as model.moe.moe_block composes it (topk_softmax router), the routed experts forced onto each
    path in turn, then every fused block path of model.moe.MOE_BLOCK_PATHS that takes the token count, against
    the float64 block routed by the same low-precision logits. Expert paths the experts sweep dropped below a
    token count are not timed above it here either."""
    w = w or moe_weights(d, s.dtype, s.device)
    route = ROUTERS["topk_softmax"]
    rows = [] if rows is None else rows
    for tokens in tokens_list:
        tick(f"moe block T={tokens}")
        x, ref, scale, distinct, floor = _block_point(d, tokens, s, ceilings, w)
        for name, path in _candidates(tokens, s, pruner, paths_at):
            m = Measurement("moe_block", tokens, name, "error", floor=floor, bound=_tolerance("block", s),
                            extra={"distinct_experts": distinct})
            routed = torch.empty(x.shape, dtype=s.dtype, device=s.device)
            out = torch.empty(x.shape, dtype=s.dtype, device=s.device)

            def block(fn=path.fn, routed=routed, out=out):
                weights, ids = route(F.linear(x, w.router), w.top_k)
                fn(x, w.w13, w.w2, weights, ids, routed)
                torch.add(routed, shared_expert(x, w), out=out)

            rows.append(measure(m, block, lambda out=out: out.fill_(float("nan")),
                                lambda out=out: (check_error(out, ref, scale), ""), s))
        for name in _fused_block_candidates(tokens, s, paths_at):
            m = Measurement("moe_block", tokens, name, "error", floor=floor, bound=_tolerance("block", s),
                            extra={"distinct_experts": distinct})
            result: dict[str, torch.Tensor] = {}  # the latest call's output (a graph's, once captured)

            def fused(fn=MOE_BLOCK_PATHS[name].fn, result=result):
                result["out"] = fn(x, w, MoEConfig(), "topk_softmax")  # its own router: the argument is unused

            def poison(result=result):
                if result:
                    result["out"].fill_(float("nan"))

            rows.append(measure(m, fused, poison, lambda result=result: (check_error(result["out"], ref, scale), ""),
                                s))
        if vllm_own.wanted(paths_at(tokens) if paths_at else None):
            _vllm_block_row(d, tokens, x, scale, distinct, floor, w, s, rows)
    return rows


def _vllm_block_row(d: MoEDims, tokens: int, x, scale: float, distinct: int, floor, w: MoEWeights, s: Settings,
                    rows: list[Measurement]) -> None:
    """vLLM's own Qwen3NextSparseMoeBlock at this point (harness/tune/blocks/vllm_own.py), as a `moe_block` row,
    checked against the float64 block routed by vLLM's own decision (at a near-tie vLLM may pick another expert)."""
    reference: dict[str, torch.Tensor] = {}

    def build():
        block, routing = vllm_own.moe_block(d, w, s.device)
        reference["ref"] = moe_block_reference(x, w, routing=routing(x))
        return lambda: block(x)

    vllm_own.row(rows, "moe_block", tokens, "MoE block", build,
                 lambda kept: check_error(kept[0], reference["ref"], scale), s, floor, _tolerance("block", s),
                 {"distinct_experts": distinct})


def _block_point(d: MoEDims, tokens: int, s: Settings, ceilings: Ceilings, w: MoEWeights):
    """(x, the float64 block routed by x's low-precision logits, the error scale, distinct experts, floor)."""
    x = moe_hidden(tokens, d, s.dtype, s.device, seed=10_000 + tokens)
    routing = moe_routing(x, w)
    ref = moe_block_reference(x, w, routing=routing)
    shared_ref = shared_expert(x.double(), w.to(torch.float64))
    # Routed and shared parts can cancel: errors are measured against the size of the two terms.
    scale = (ref - shared_ref).norm().item() + shared_ref.norm().item()
    distinct = int(routing[1].unique().numel())
    return x, ref, scale, distinct, floor_of(moe_block_work(tokens, distinct, d, x.element_size()), ceilings)


def graphed_block_tokens(tokens_list, device: torch.device) -> list[int]:
    """The token counts the graphed block is timed at: CUDA only, up to its largest bucket."""
    from model.moe.graphed_block import BUCKETS  # here: `--ab` runs this harness on older model packages

    return [t for t in tokens_list if t <= BUCKETS[-1]] if device.type == "cuda" else []


def sweep_graphed_block(d: MoEDims, tokens_list, s: Settings, ceilings: Ceilings, tick: Callable[[str], None],
                        w: MoEWeights | None = None, rows: list[Measurement] | None = None) -> list[Measurement]:
    """What the block replayed from a per-bucket CUDA graph (model.moe.GraphedMoEBlock) costs an eager caller:
    the copy in, the replay and the copy out, timed as an eager call (L2 flushed), for each block path it can
    capture at each token count up to its largest bucket. Rows are block `moe_block_graphed`, which no dispatch
    table records: a graph replay is not an eager path, and a whole-step capture cannot hold it."""
    from model.moe.graphed_block import GraphedMoEBlock  # here: `--ab` runs this harness on older model packages

    rows = [] if rows is None else rows
    w = w or moe_weights(d, s.dtype, s.device)
    eager_only = replace(s, graphs=False)
    for tokens in graphed_block_tokens(tokens_list, s.device):
        tick(f"moe block graphed T={tokens}")
        x, ref, scale, distinct, floor = _block_point(d, tokens, s, ceilings, w)
        for name in ("composed", *_fused_block_candidates(tokens, s, None)):
            m = Measurement("moe_block_graphed", tokens, name, "error", floor=floor, bound=_tolerance("block", s),
                            extra={"distinct_experts": distinct})
            graphed, result = GraphedMoEBlock(w, block=name), {}

            def call(graphed=graphed, result=result):
                result["out"] = graphed(x)

            rows.append(measure(m, call, result.clear,
                                lambda result=result: (check_error(result["out"], ref, scale), ""), eager_only))
            m.graph_note = "is itself a graph replay: eager is its cost to an eager caller"
            del graphed
    return rows


def _fused_block_candidates(tokens: int, s: Settings, paths_at: PathsAt | None) -> list[str]:
    """The fused MoE block paths to time at `tokens` (the composed block is timed once per expert path above)."""
    only = paths_at(tokens) if paths_at else None
    return [name for name in fused_block_paths() if (only is None or name in only)
            and MOE_BLOCK_PATHS[name].supports(tokens, s.dtype, s.device)]


def sweep_moe_router(d: MoEDims, tokens_list, s: Settings, tick: Callable[[str], None], w: MoEWeights | None = None,
                     rows: list[Measurement] | None = None) -> list[Measurement]:
    """Every router of model.moe.ROUTERS that runs here (the reference is the check, not a candidate), on the
    same router logits at each token count: the routing alone, as moe_block calls it after the router GEMM.
    Outputs are checked against route_reference: ids exactly, weights within tolerances.ROUTER_WEIGHTS (the
    largest absolute difference, which the rows' `err` column shows). Rows are block `moe_router`, which the
    dispatch table does not record: a router is chosen by hand (model.qwen36's `Qwen36Paths.router`)."""
    w = w or moe_weights(d, s.dtype, s.device)
    rows = [] if rows is None else rows
    bound = tolerances.ROUTER_WEIGHTS[torch.float32]
    for tokens in tokens_list:
        tick(f"moe router T={tokens}")
        logits = F.linear(moe_hidden(tokens, d, s.dtype, s.device, seed=20_000 + tokens), w.router)
        ref_weights, ref_ids = route_reference(logits, w.top_k)
        for path in ROUTERS.candidates():
            if not path.supports(tokens, s.dtype, s.device):
                continue
            out: dict[str, torch.Tensor] = {}  # the latest call's outputs (a graph's, once captured)

            def call(route=path.fn, out=out):
                out["weights"], out["ids"] = route(logits, w.top_k)

            def poison(out=out):
                if out:
                    out["weights"].fill_(float("nan"))
                    out["ids"].fill_(-1)

            def check(out=out):
                if not torch.equal(out["ids"], ref_ids):
                    return float("inf"), "expert ids differ from route_reference's"
                return (out["weights"].double() - ref_weights.double()).abs().max().item(), ""

            rows.append(measure(Measurement("moe_router", tokens, path.name, "error", bound=bound), call, poison,
                                check, s))
    return rows
