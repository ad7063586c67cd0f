"""One path at one point: run it into NaN-poisoned outputs, check it against the float64 reference, time it
eagerly, then capture it in a CUDA graph, check the replay's output too and time the replays.

Beside those two times (each as a caller pays it: the graph's includes its launch), every point gets the GPU's
own time (`gpu`: the replay, or where nothing captured the eager call, with the launch hidden behind a busy
stream: measure/timing.py `time_hidden`) and the host's microseconds per call (`host_us`), and, in the sweep
that asks (`Settings.count_launches`), the launches of one eager call and of one replay
(measure/launch_count.py): the figures the GPU gate judges apart.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection, Iterator

import torch

from .floors import Floor
from .launch_count import launches_of_call, launches_of_replay
from .timing import L2Flusher, Timing, capture_graph, host_us_per_call, time_eager, time_graph, time_hidden

__all__ = ["Settings", "Measurement", "measure", "check_error", "kept_outputs", "tolerance_for", "path_rows"]

# A check returns the relative error against the reference (inf for NaN) and a note ("" when nothing odd).
Check = Callable[[], tuple[float, str]]


@dataclass(frozen=True)
class Settings:
    device: torch.device
    dtype: torch.dtype
    reps: int
    warmup: int
    graphs: bool  # time CUDA-graph replays too
    flusher: L2Flusher
    slow_call_us: float = 50_000.0  # calls slower than this get 3 samples: they are never the choice
    count_launches: bool = False  # count one call's launches (one sweep of a run asks: the count is exact)


# Host time per call is taken over enough back-to-back calls to last about this long (at least 3, at most 200).
HOST_SPAN_US = 20_000.0
# The spin that hides a call's launch outlasts the call as a caller times it (host and GPU) by this much.
HIDE_MARGIN_US = 20.0


def host_calls(eager_us: float) -> int:
    return max(3, min(200, int(HOST_SPAN_US / max(eager_us, 1.0))))


@dataclass
class Measurement:
    block: str
    key: int  # tokens per call, or the decode batch
    path: str
    status: str  # ok | wrong | error
    detail: str = ""
    eager: Timing | None = None
    graph: Timing | None = None
    graph_note: str = ""
    gpu: Timing | None = None  # the GPU's own time, launch hidden: the replay where captured, else the eager call
    host_us: float | None = None  # host microseconds per eager call, back to back
    launches: dict[str, int] | None = None  # of one eager call (measure/launch_count.py); None: not counted
    graph_launches: dict[str, int] | None = None  # of one replay
    err_eager: float | None = None
    err_graph: float | None = None
    bound: float | None = None
    floor: Floor | None = None
    extra: dict = field(default_factory=dict)

    def best(self, prefer_graph: bool) -> tuple[float, str] | None:
        """(microseconds, mode) that ranks this path: graph replay where wanted and captured, else eager."""
        if self.status != "ok" or self.eager is None:
            return None
        if prefer_graph and self.graph is not None:
            return self.graph.median_us, "graph"
        return self.eager.median_us, "eager"

    def as_dict(self) -> dict:
        floor_us = self.floor.us if self.floor else None
        return {
            "block": self.block, "key": self.key, "path": self.path, "status": self.status, "detail": self.detail,
            "eager": self.eager.as_dict() if self.eager else None,
            "graph": self.graph.as_dict() if self.graph else None, "graph_note": self.graph_note,
            "gpu": self.gpu.as_dict() if self.gpu else None, "host_us": self.host_us, "launches": self.launches,
            "graph_launches": self.graph_launches,
            "err_eager": self.err_eager, "err_graph": self.err_graph, "bound": self.bound,
            "floor": None if self.floor is None else {
                "hbm_us": self.floor.hbm_us, "compute_us": self.floor.compute_us, "floor_us": floor_us},
            "eager_x_floor": self.eager.median_us / floor_us if self.eager and floor_us else None,
            "graph_x_floor": self.graph.median_us / floor_us if self.graph and floor_us else None,
            **self.extra,
        }


def check_error(out: torch.Tensor, ref: torch.Tensor, scale: float | None = None) -> float:
    """||out - ref|| / ||ref|| (or / scale) in float64; inf when out has a non-finite value."""
    out64 = out.double()
    if not torch.isfinite(out64).all():
        return float("inf")
    denom = ref.double().norm().item() if scale is None else scale
    diff = (out64 - ref.double()).norm().item()
    return diff / denom if denom > 0 else diff


def kept_outputs(run: Callable[[], object]):
    """(call, reset, kept) for a path that returns its outputs (its calling convention has no `out`). `call`
    first lets go of the outputs of the call before (poisoned by `reset`), so an eager call of the same size is
    handed that memory back by the CUDA caching allocator and must overwrite the NaN; a graph keeps its capture's
    outputs, which `reset` poisons before each replay. The check reads `kept`, the last call's outputs."""
    kept: list[torch.Tensor] = []

    def call():
        kept.clear()
        out = run()
        kept.extend(out if isinstance(out, tuple) else (out,))

    def reset():
        for t in kept:
            t.fill_(float("nan"))

    return call, reset, kept


def tolerance_for(table: dict, path: str, s: Settings) -> float | None:
    """A model/tolerances.py table's bound for `path` in the run's dtype; None where it has none."""
    return table.get(path, {}).get(s.dtype)


def path_rows(table, block: str, key: int, tokens: int, only: Collection[str] | None, s: Settings,
              bounds: dict, bounds_name: str, floor: Floor, extra: dict,
              rows: list[Measurement]) -> Iterator[tuple[object, Measurement]]:
    """The candidates of `table` (a model.dispatch.paths.PathTable) to time at one point: those `only` names (None: all)
    that take `tokens` in the run's dtype on its device, each given a row appended to `rows`. Yields (path, row)
    for the paths with a bound in `bounds` (model/tolerances.py's `bounds_name`); a row without one says so and
    is not timed."""
    for path in table.candidates():
        if (only is not None and path.name not in only) or not path.supports(tokens, s.dtype, s.device):
            continue
        m = Measurement(block, key, path.name, "error", floor=floor, bound=tolerance_for(bounds, path.name, s),
                        extra=dict(extra))
        rows.append(m)
        if m.bound is None:
            m.detail = f"no {s.dtype} tolerance for {table.what} {path.name!r} in model/tolerances.py ({bounds_name})"
            continue
        yield path, m


def measure(m: Measurement, call: Callable[[], object], reset: Callable[[], None], check: Check,
            s: Settings) -> Measurement:
    """Fill `m` in: status, errors and timings. Failures become a status, never an exception."""
    try:
        _measure(m, call, reset, check, s)
    except torch.cuda.OutOfMemoryError as exc:
        m.status, m.detail = "error", f"out of memory: {_first_line(exc)}"
        torch.cuda.empty_cache()
    except Exception as exc:
        m.status, m.detail = "error", f"{type(exc).__name__}: {_first_line(exc)}"
    if s.device.type == "cuda":
        try:
            torch.cuda.synchronize(s.device)
        except Exception as exc:  # a sticky device error: later points will fail too, and say so
            m.status, m.detail = "error", f"device error after the call: {type(exc).__name__}: {_first_line(exc)}"
    return m


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def _measure(m, call, reset, check, s: Settings) -> None:
    reset()
    call()
    m.err_eager, note = check()
    if note or not m.err_eager <= m.bound:
        m.status, m.detail = "wrong", note or f"relative error {m.err_eager:.3e} > bound {m.bound:.1e}"
        return
    probe = time_eager(call, s.device, s.flusher, 1, max(0, s.warmup - 1))
    reps = 3 if probe.median_us > s.slow_call_us else s.reps
    m.eager = time_eager(call, s.device, s.flusher, reps, 0)
    m.status = "ok"
    m.host_us = host_us_per_call(call, s.device, host_calls(m.eager.median_us))
    if s.count_launches:
        m.launches = launches_of_call(call, s.device)
    if s.graphs:
        _replay(m, call, reset, check, s, reps)
    else:
        m.graph_note = "graphs off" if s.device.type == "cuda" else f"no CUDA graphs on {s.device.type}"
    if m.gpu is None:  # nothing replayed: the eager call's kernels, launched behind a busy stream
        m.gpu = time_hidden(call, s.device, s.flusher, reps, 1.5 * m.eager.median_us + HIDE_MARGIN_US)


def _replay(m, call, reset, check, s: Settings, reps: int) -> None:
    """Capture `call`, check a replay's output, time the replays as a caller does and with the launch hidden."""
    graph, why = capture_graph(call, s.device)
    if graph is None:
        m.graph_note = why
        return
    try:
        reset()
        graph.replay()
        m.err_graph, note = check()
        if note or not m.err_graph <= m.bound:
            m.graph_note = f"graph replay wrong: {note or f'relative error {m.err_graph:.3e}'}"
            return
        m.graph = time_graph(graph, s.device, s.flusher, reps)
        m.gpu = time_hidden(graph.replay, s.device, s.flusher, reps, m.graph.median_us + HIDE_MARGIN_US)
        if s.count_launches:
            m.graph_launches = launches_of_replay(graph.replay, s.device)
    finally:
        del graph
