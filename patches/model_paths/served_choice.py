"""Which path serves a block the plugin substitutes in vLLM's model, call by call: this device's dispatch table, or
vLLM's own layer.

Rule (per device, never blind):
- the device's own table (model.dispatch.table: `<device name>.json`, or `QWEN36_DISPATCH_TABLE`) has a row for the
  block at this key naming a model path that can run the input: that path serves;
- the table says vLLM's own layer was timed faster at this key (`vllm_faster`, which `qwen36 tune` records where
  it times vLLM's layer as a candidate; or a row naming `vllm`), or there is no row, no table, or the path cannot
  run here: vLLM's own layer serves. The NVIDIA defaults that fill gaps in the model's own step
  (model/dispatch/nvidia_defaults.py) do not apply here: they were chosen against the model's other paths, never
  against vLLM's;
- where no row of the device's table could serve the block at all, `may_serve` says so once per device and dtype,
  and the substitute returns vLLM's forward before it reads anything of vLLM's;
- `QWEN36_SERVED_BLOCKS_FORCE=1` (tests; patches.settings reads it): where the table would leave vLLM's own, the
  model's own serving choice for the block serves instead (its dispatcher's default on this device), so every seam
  adapter runs on a CPU server where vLLM's C++ kernels may well be the faster ones.
A compiled server (no --enforce-eager) asks here at run time too: traced, each substitute is one opaque op
(patches/model_paths/served_ops.py) whose call runs the same eager code, so no choice is frozen into a graph; only
`may_serve`, fixed for a process, is a constant of the graph.

A log line marks the first call each (block, path) serves, and the first time a block leaves vLLM's own in place
with the reason, so a server's log says what ran. `SERVED` counts the calls (tests read it in-process).
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Callable

import torch

from model.dispatch.table import table_choice_for

__all__ = ["VLLM_OWN", "SERVED", "BlockServing", "configure", "forced", "table_rows_detail", "serving_device"]

VLLM_OWN = "vllm"  # a table row naming vLLM's own layer
# (block, path or VLLM_OWN) -> calls that asked, in this process; a device whose table cannot serve the block at all
# counts once (may_serve answers before anything else is asked).
SERVED: Counter = Counter()

_log = logging.getLogger("vllm.qwen36.patches.served_blocks")  # under "vllm." to share vLLM's log handler


class _State:
    force = False
    generation = 0  # bumped by configure: the memoised choices of every block start again
    logged: set[tuple[str, str]] = set()


def configure(force: bool) -> None:
    """Set at install (patches.settings reads the switch); clears the memoised choices."""
    _State.force = force
    _State.generation += 1


def forced() -> bool:
    return _State.force


def serving_device() -> torch.device:
    """The device this process serves on, for the status row: the current CUDA device, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def table_rows_detail(block: str, device: torch.device) -> str:
    """`table <source> (bfloat16): add_rms_norm 1-8 triton (0.40x vLLM's own time), 9- fused; vLLM's own timed faster
    at ...`, or why vLLM's own serves the block on `device`."""
    choice = table_choice_for(device)
    table = choice.table
    if table is None:
        return f"no table ({choice.detail.split(':')[0]}): vLLM's own"
    ranges = table.blocks.get(block, ())
    if not ranges:
        return f"table {table.source} has no {block} row: vLLM's own"
    spans = ", ".join(_span(r) + f" {r.path}" + (f" ({r.time_ratio:.2f}x vLLM's own time)" if r.time_ratio else "")
                      for r in ranges)
    faster = ", ".join(_span(r) + (f" ({r.time_ratio:.2f}x the model's time)" if r.time_ratio else "")
                       for r in table.vllm_faster.get(block, ()))
    return f"table {table.source} ({table.dtype}): {block} {spans}" + (
        f"; vLLM's own timed faster at {faster}" if faster else "")


def _span(r) -> str:
    return f"{r.low}-{'' if r.high is None else r.high}"


def _choice(block: str, key: int, num_tokens: int, device: torch.device, dtype: torch.dtype, force: bool,
            paths, default: str) -> tuple[str | None, str]:
    table = table_choice_for(device).table
    row = (None if table is None else VLLM_OWN if table.vllm_faster_at(block, key, dtype)
           else table.path_for(block, key, dtype))
    if row is not None and row != VLLM_OWN and paths.can_run(row, num_tokens, dtype, device):
        return row, f"table row {table.source}"
    why = ("the table timed vLLM's own faster here" if row == VLLM_OWN
           else "no table" if table is None
           else f"the table's row {row!r} cannot run {dtype} on {device}" if row is not None
           else f"the table has no {block} row at {key}")
    if force and paths.can_run(default, num_tokens, dtype, device):
        return default, f"forced (QWEN36_SERVED_BLOCKS_FORCE=1; {why})"
    return None, why


class BlockServing:
    """The per-call choice for one block: `path(key, num_tokens, device, dtype)` -> a model path name, or None for
    vLLM's own. `default(key, device, dtype)` is the model's own serving choice (used only when forced)."""

    def __init__(self, block: str, paths, default: Callable[[int, torch.device, torch.dtype], str]) -> None:
        self.block = block
        self.paths = paths
        self.default = default
        # Memoised per call shape: the table and the switches are fixed for a server process, and an eager decode
        # step asks once per layer.
        self._answers: dict[tuple, tuple[str | None, str]] = {}
        self._may: dict[tuple, bool] = {}

    def may_serve(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether any call on this device and dtype could take a model path: forced, or the device's table has a
        row for the block naming something other than vLLM's own. False lets the substitute return vLLM's forward
        before it reads anything of vLLM's (no table on the platform: nothing of ours runs)."""
        question = (_State.generation, device, dtype)
        answer = self._may.get(question)
        if answer is None:
            table = table_choice_for(device).table
            rows = () if table is None else table.ranges_for(self.block, dtype)
            everywhere = table is not None and any(r.low == 1 and r.high is None  # merged ranges: one covers all
                                                   for r in table.vllm_faster_for(self.block, dtype))
            answer = self._may[question] = _State.force or (not everywhere and any(r.path != VLLM_OWN for r in rows))
            if not answer:
                self._served(None, "no table row for this device and dtype names a model path")
        return answer

    def path(self, key: int, num_tokens: int, device: torch.device, dtype: torch.dtype) -> str | None:
        """Asked at run time only (eagerly, or inside a served op), never while Dynamo traces (module docstring)."""
        question = (_State.generation, key, num_tokens, device, dtype)
        answer = self._answers.get(question)
        if answer is None:
            default = self.default(key, device, dtype) if _State.force else ""
            answer = self._answers[question] = _choice(self.block, key, num_tokens, device, dtype, _State.force,
                                                       self.paths, default)
        return self._served(*answer)

    def _served(self, name: str | None, why: str) -> str | None:
        served = name or VLLM_OWN
        SERVED[(self.block, served)] += 1
        if (self.block, served) not in _State.logged:
            _State.logged.add((self.block, served))
            _log.info("qwen36 served %s: %s (%s)", self.block,
                      f"model path {name}" if name else "vLLM's own", why)
        return name
