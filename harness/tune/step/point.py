"""The whole decode step as a gated point: recorded by `qwen36 tune`, judged by `--check` and `--ab` with the rule
of every other point (harness/tune/check/rule.py).

A change that adds a copy per layer to the step's composition passes every block point; this point catches it.
Row `decode_step`, key B (sequences per step), path `served`: one rank's whole text model at the table's dims
(random weights, built once per process), each sequence prefilled with STEP_PREFILL tokens, then the next
decode step with the paths the device's table serves. Eager: the step over the prefilled (dynamic) cache, as
`qwen36 tune step` times it. Graph: the same step over a static cache replayed from a CUDA graph
(harness/tune/step/graph.py), where the replay gave the eager static step's logits bit for bit; otherwise the
row says why and has no graph time. The output is checked only for being finite: each block's output is
checked against float64 at its own points, and the whole step's agreement is the numerics suite's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from model.qwen36 import Qwen36Config, Qwen36Model, Qwen36Paths

from ..measure import dims as D
from ..measure.inputs import rank_config, rank_weights
from ..measure.point import Measurement, Settings
from ..measure.launch_count import launches_of_call
from ..measure.point import host_calls
from ..measure.timing import host_us_per_call, time_eager
from .graph import measure_static_step
from .run import QWEN36_35B_A3B, STEP_PREFILL, TINY_MODEL, prefilled

__all__ = ["STEP_BLOCK", "STEP_GATE_BATCHES", "STEP_PATH", "StepPoints", "step_model_config"]

STEP_BLOCK, STEP_PATH = "decode_step", "served"
STEP_GATE_BATCHES = (1, 8)
TP = 4  # the built-in dims are one rank of TP=4


def step_model_config(dims_name: str, hf_config: Path | None = None, tp: int = TP) -> Qwen36Config:
    """One rank's model config for the dims a table was recorded at (ValueError for a name this code lacks)."""
    if hf_config is not None:
        return rank_config(Qwen36Config.from_pretrained_dir(hf_config), tp)
    known = {D.REAL_PER_RANK.name: QWEN36_35B_A3B, D.TINY.name: TINY_MODEL}
    if dims_name not in known:
        raise ValueError(f"no whole model for dims {dims_name!r}: pass --hf-config DIR (and --tp)")
    return rank_config(Qwen36Config.from_hf_dict(known[dims_name]), tp)


class StepPoints:
    """One rank's model, built on first use and kept for the process's sweeps, and each batch's prefill."""

    def __init__(self, config: Qwen36Config, s: Settings, prefill: int = STEP_PREFILL):
        self.config, self.s, self.prefill = config, s, prefill
        self._model: Qwen36Model | None = None
        self._prefilled: dict[int, tuple[torch.Tensor, object]] = {}

    def _state(self, batch: int):
        if self._model is None:
            self._model = Qwen36Model(rank_weights(self.config, self.s.dtype, self.s.device), Qwen36Paths())
        if batch not in self._prefilled:  # the prompt `qwen36 tune step` times its step after
            self._prefilled[batch] = prefilled(self._model, batch, self.prefill, self.s.device)
        return self._model, *self._prefilled[batch]

    def measure(self, batch: int, tick: Callable[[str], None], s: Settings | None = None) -> Measurement:
        """One sweep of the step at `batch` (with `s`, else the settings it was built with); never raises for a step
        that fails (the row says why)."""
        s = s or self.s
        m = Measurement(STEP_BLOCK, batch, STEP_PATH, "error", bound=float("inf"),
                        extra={"batch": batch, "prefill": self.prefill})
        tick(f"decode step B={batch}")
        try:
            model, ids, cache = self._state(batch)
            step = lambda: model.forward(ids, cache)  # noqa: E731  (the prefilled cache is never modified)
            m.eager = time_eager(step, s.device, s.flusher, s.reps, s.warmup)
            m.host_us = host_us_per_call(step, s.device, host_calls(m.eager.median_us))
            if s.count_launches:
                m.launches = launches_of_call(step, s.device)
            logits = model.forward(ids, cache)[0]
            if not torch.isfinite(logits).all():
                m.status, m.detail = "wrong", "the step's logits are not finite"
                return m
            graph = measure_static_step(model, cache, ids, logits, s, lambda label: None)
            if graph.status == "ok" and not graph.replay_equals_eager:
                m.status = "wrong"
                m.detail = (f"the graph replay's logits differ from the eager static step's (max abs difference "
                            f"{graph.replay_max_abs_diff:.3g})")
                return m
            if graph.status == "ok":
                m.graph, m.gpu, m.graph_launches = graph.replay, graph.replay_gpu, graph.replay_launches
            else:
                m.graph_note = f"{graph.status}: {graph.detail}".rstrip(": ")
            m.status = "ok"
        except Exception as exc:  # out of memory, a path that fails at these dims: reported, the sweep goes on
            m.status, m.detail = "error", f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        return m

    def sweep(self, batches, tick: Callable[[str], None], rows: list[Measurement], s: Settings | None = None) -> None:
        """Appends one row per batch to `rows` as it goes."""
        for batch in batches:
            rows.append(self.measure(batch, tick, s))
