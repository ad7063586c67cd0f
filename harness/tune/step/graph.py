"""`qwen36 tune step`'s graph column: the decode step over a static cache, eager and replayed from a CUDA graph.

After the eager (dynamic-cache) step is timed, the prefilled cache is copied into a StaticDecodeCache of
prefill + CHECK_STEPS positions (model/qwen36/static_cache.py) and the step runs over it
(model/qwen36/static_step.py): eager on any device, then, on CUDA, captured once and replayed. Every timed sample
is the same step from the same state: the buffers are restored before each (with the L2 flush, outside the
timed span), so the replay writes the position the eager step writes and its attention reads prefill + CHECK_STEPS
keys (masked past prefill + 1). Before timing, CHECK_STEPS greedy steps are run eagerly twice and then replayed
from the same state: the replay must give the eager static step's logits bit for bit (the same kernels), and the
second eager run says whether the kernels themselves are reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from model.qwen36 import CapturableDecodeStep, Qwen36Cache, Qwen36Model
from model.qwen36.static_step import StepSnapshot, greedy_logits

from ..measure.point import Settings
from ..measure.launch_count import launches_of_replay
from ..measure.point import HIDE_MARGIN_US
from ..measure.timing import L2Flusher, Timing, graphs_supported, time_eager, time_graph, time_hidden

__all__ = ["CHECK_STEPS", "GraphResult", "RestoringFlusher", "measure_static_step", "relative_difference"]

CHECK_STEPS = 3  # greedy steps compared between the eager static step and the replay


@dataclass
class GraphResult:
    status: str  # ok | skipped (capture refused; detail says why) | error | n/a (CUDA only) | off (--no-graph)
    detail: str = ""
    max_len: int | None = None
    static_eager: Timing | None = None  # the eager step over the static cache
    replay: Timing | None = None
    replay_gpu: Timing | None = None  # the replay's GPU time, its launch hidden (measure/timing.py time_hidden)
    replay_launches: dict[str, int] | None = None  # of one replay, where the settings ask for counts
    static_vs_dynamic: float | None = None  # relative error of the static step's logits against the dynamic step's
    replay_equals_eager: bool | None = None  # bit for bit over CHECK_STEPS greedy steps
    replay_max_abs_diff: float | None = None
    eager_reproducible: bool | None = None  # two eager runs of those steps bit-equal

    def tokens_per_s(self, batch: int, timing: Timing | None) -> float | None:
        return batch / (timing.median_us * 1e-6) if timing and timing.median_us > 0 else None

    def as_dict(self, batch: int) -> dict:
        return {"status": self.status, "detail": self.detail, "max_len": self.max_len,
                "static_eager": self.static_eager.as_dict() if self.static_eager else None,
                "static_eager_tokens_per_s": self.tokens_per_s(batch, self.static_eager),
                "replay": self.replay.as_dict() if self.replay else None,
                "replay_tokens_per_s": self.tokens_per_s(batch, self.replay),
                "static_vs_dynamic_rel_err": self.static_vs_dynamic,
                "replay_equals_eager": self.replay_equals_eager, "replay_max_abs_diff": self.replay_max_abs_diff,
                "eager_reproducible": self.eager_reproducible}


class RestoringFlusher:
    """Before each timed sample: the step's state back to `saved` (every sample is the same step), then the L2
    flush, so the restore's copies neither count nor leave the state in L2."""

    def __init__(self, step: CapturableDecodeStep, saved: StepSnapshot, flusher: L2Flusher):
        self.step, self.saved, self.flusher = step, saved, flusher

    def flush(self) -> None:
        self.step.restore(self.saved)
        self.flusher.flush()


def _bit_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def relative_difference(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, in float64."""
    ref64 = ref.double()
    return ((out.double() - ref64).norm() / ref64.norm()).item()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _why(exc: BaseException) -> str:
    """The exception, and the one that started it: a refused op inside a capture often surfaces as the capture's
    end failing ('operation failed due to a previous error during capture'), which names no cause."""
    first, seen = exc, {id(exc)}
    while first.__context__ is not None and id(first.__context__) not in seen:
        first = first.__context__
        seen.add(id(first))
    return _first_line(exc) if first is exc else f"{_first_line(exc)} (raised first: {_first_line(first)})"


def measure_static_step(model: Qwen36Model, cache: Qwen36Cache, ids: torch.Tensor, dynamic_logits: torch.Tensor,
                        s: Settings, tick) -> GraphResult:
    """The static step after `cache` (the prefill) on `ids`: eager everywhere, graph replay on CUDA when
    `s.graphs`. Never raises for a step that cannot be captured: the result says why."""
    batch = ids.shape[0]
    step = CapturableDecodeStep.from_prefill(model, cache, cache.length + CHECK_STEPS)
    saved = step.snapshot()
    result = GraphResult("n/a (CUDA only)", max_len=step.cache.max_len)
    result.static_vs_dynamic = relative_difference(step.run(ids), dynamic_logits)
    step.restore(saved)
    tick(f"B={batch}: {s.reps} timed decode steps over the static cache")
    rewind = RestoringFlusher(step, saved, s.flusher)
    for _ in range(s.warmup):
        step.run(ids)
        step.restore(saved)
    result.static_eager = time_eager(lambda: step.run(ids), s.device, rewind, s.reps, 0)
    if not graphs_supported(s.device):
        return result
    if not s.graphs:
        result.status = "off (--no-graph)"
        return result
    tick(f"B={batch}: capture the step in a CUDA graph, {s.reps} timed replays")
    step.restore(saved)
    eager = greedy_logits(step.run, ids, CHECK_STEPS)
    step.restore(saved)
    result.eager_reproducible = _bit_equal(eager, greedy_logits(step.run, ids, CHECK_STEPS))
    step.restore(saved)
    try:
        step.capture(warmup=max(s.warmup, 1))
    except Exception as exc:  # a host read or sync in a path this B runs: the reason goes to the report
        result.status, result.detail = "skipped", f"capture failed: {_why(exc)}"
        return result
    replayed = greedy_logits(step.replay, ids, CHECK_STEPS)
    result.replay_max_abs_diff = _max_abs_diff(eager, replayed)
    result.replay_equals_eager = _bit_equal(eager, replayed)
    step.restore(saved)
    # time_graph replays through `step` (its replay() is the graph's, with the host's capacity count).
    result.replay = time_graph(step, s.device, rewind, s.reps)
    result.replay_gpu = time_hidden(step.replay, s.device, rewind, s.reps, result.replay.median_us + HIDE_MARGIN_US)
    if s.count_launches:
        step.restore(saved)
        result.replay_launches = launches_of_replay(step.replay, s.device)
    step.restore(saved)
    result.status = "ok"
    return result
