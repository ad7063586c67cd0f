"""The whole model's decode step over a StaticDecodeCache, run eagerly or captured once in a CUDA graph and replayed.

Token ids go in through one buffer and the logits come out in one tensor; every state lives in the cache's
buffers and the length on the device (model/qwen36/static_cache.py). So the captured step is the eager static
step, kernel for kernel, at every length below max_len. The host still counts the tokens the cache holds
(`position`): it refuses a step past max_len before launching anything, which a step inside a graph cannot check
without reading the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..attention.layer import StaticKVCache
from .model import Qwen36Cache, Qwen36Model
from .static_cache import StaticDecodeCache

__all__ = ["CapturableDecodeStep", "StepSnapshot", "greedy_logits"]


@dataclass(frozen=True)
class StepSnapshot:
    position: int
    buffers: list[torch.Tensor]


class CapturableDecodeStep:
    """One decode step of `model` for the batch and buffers of `cache`, which holds `position` tokens."""

    def __init__(self, model: Qwen36Model, cache: StaticDecodeCache, position: int):
        self.model, self.cache, self.position = model, cache, position
        first = cache.layers[0]
        batch = first.k.shape[0] if isinstance(first, StaticKVCache) else first.conv.shape[0]
        self.ids = torch.zeros(batch, 1, dtype=torch.int64, device=cache.length.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_logits: torch.Tensor | None = None  # the captured step's output, rewritten by each replay

    @classmethod
    def from_prefill(cls, model: Qwen36Model, cache: Qwen36Cache, max_len: int) -> "CapturableDecodeStep":
        """The step after a prefill's dynamic cache, in buffers of `max_len` positions."""
        return cls(model, StaticDecodeCache.from_prefill(cache, max_len), cache.length)

    def load(self, cache: Qwen36Cache) -> None:
        """Another prefill's dynamic cache (same batch) into the same buffers: a captured graph still applies."""
        if cache.length >= self.cache.max_len:
            raise ValueError(f"a prefill of {cache.length} tokens leaves no room in max_len={self.cache.max_len}")
        self.cache.load(cache)
        self.position = cache.length

    def _take_position(self) -> None:
        if self.position >= self.cache.max_len:
            raise ValueError(f"the static cache is full: {self.position} of max_len={self.cache.max_len} positions "
                             "hold tokens; allocate a longer one (or restore a snapshot)")
        self.position += 1

    def run(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """One eager step on `ids` [B, 1] (None: the ids buffer as it is); logits [B, 1, vocab], a new tensor."""
        self._take_position()
        if ids is not None:
            self.ids.copy_(ids)
        logits, _ = self.model.forward(self.ids, self.cache)
        return logits

    def snapshot(self) -> StepSnapshot:
        return StepSnapshot(self.position, self.cache.snapshot())

    def restore(self, snapshot: StepSnapshot) -> None:
        """The cache's buffers and the host count back to `snapshot` (the same addresses: a graph still applies)."""
        self.cache.restore(snapshot.buffers)
        self.position = snapshot.position

    def capture(self, warmup: int = 3) -> None:
        """Record one step in a CUDA graph (CUDA only). As torch's CUDA-graph notes ask, the step first runs
        `warmup` times on a side stream (Triton compiles and autotunes, cuBLAS picks its workspace, the allocator
        settles), each from the state it found, which is restored afterwards; the captured step runs nothing.
        A step that cannot be captured (a host read, a synchronisation) raises; the cache is as it was."""
        if self.cache.length.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; this cache is on {self.cache.length.device}")
        saved = self.snapshot()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    self.model.forward(self.ids, self.cache)
                    self.restore(saved)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits, _ = self.model.forward(self.ids, self.cache)
        finally:
            torch.cuda.synchronize()
            self.restore(saved)
        self.graph, self.graph_logits = graph, logits

    def replay(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """One step by replaying the captured graph; the logits tensor is the graph's and is rewritten by the
        next replay (clone it to keep it)."""
        if self.graph is None:
            raise ValueError("no graph captured: call capture() first")
        self._take_position()
        if ids is not None:
            self.ids.copy_(ids)
        self.graph.replay()
        return self.graph_logits


def greedy_logits(run: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """`steps` decode steps by `run` (a step's eager run or its replay), each on the previous step's greedy
    tokens: the logits of each, cloned (a replay overwrites its output buffer)."""
    out = []
    for _ in range(steps):
        logits = run(ids).clone()
        out.append(logits)
        ids = logits[:, -1].argmax(-1, keepdim=True)
    return out
