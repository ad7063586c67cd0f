"""Measured dispatch tables: for each block, token-count (or batch) ranges -> the fastest correct path on a
device, written by `qwen36 tune` on the serving machine, one JSON file per device name.

Which table a dispatcher uses, per device it runs on:
| variable               | value                  | meaning                                                        |
|------------------------|------------------------|----------------------------------------------------------------|
| QWEN36_DISPATCH_TABLE  | unset or empty         | the device's own table, `<dir>/<device name>.json` (CUDA only)  |
|                        | `off`                  | no table: the knobs of model.moe.config decide, as before       |
|                        | a path to a JSON table | that table, on any device (CPU included)                        |
| QWEN36_DISPATCH_DIR    | a directory            | where device tables live (default: the checkout's              |
|                        |                        | fixtures/dispatch, beside the `model` package)                  |
A device name becomes a file name by lower-casing it and joining its words with '-' ("NVIDIA H200" ->
nvidia-h200.json). Where an NVIDIA GPU's table has no row for a block (or the GPU has no table), the NVIDIA
defaults serve (model/dispatch/nvidia_defaults.py: the paths fast and capturable there). With no table for
another device, or none on a CPU unless named explicitly, the dispatchers keep their knob-driven choice, so CPU
behaviour is unchanged. A table applies only to inputs of the dtype it was measured in, and an entry naming a
path that cannot run the input falls back to the knobs too. Beside its `ranges` (the fastest of the model's own
paths, which the model's dispatchers serve), a block may list `vllm_faster` ranges: where `qwen36 tune` timed vLLM's
own layer as a candidate and it beat that path, so the plugin's served blocks leave vLLM's layer in place there
(patches/model_paths/served_choice.py). A `ranges` row naming `vllm` (tables written by hand) means the same to the
served blocks; the model's own dispatchers, which cannot run vLLM's layer, fall back to their knobs there.

File format (schema "qwen36-dispatch/2"; "qwen36-dispatch/1" files, written before 2026-12-04, read the same):
    {"schema": "qwen36-dispatch/2", "device": "NVIDIA H200", "dtype": "bfloat16", "recorded": {...},
     "blocks": {"moe_experts": {"keyed_by": "tokens", "ranges": [{"from": 1, "to": 1, "path": "decode_fused"},
                                                                  {"from": 2, "to": null, "path": "..."}]}, ...}}
`to: null` leaves the range open above. Extra keys are kept for readers and ignored here: schema 2 adds
`timings`, every path's eager and graph time at every point, sweep by sweep and run by run, which the GPU perf
gate (harness/tune/check/rule.py, `qwen36 tune --check`) compares against; schema 1 has none.
"""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import torch

from .nvidia_defaults import NVIDIA_DEFAULT_BLOCKS, NVIDIA_DEFAULT_DTYPE, NVIDIA_PREFIX

__all__ = [
    "BLOCKS",
    "DIR_ENV",
    "SCHEMA",
    "TABLE_ENV",
    "CHECKOUT_TABLE_DIR",
    "DispatchTable",
    "DispatchTableError",
    "NVIDIA_DEFAULTS",
    "READABLE_SCHEMAS",
    "TableChoice",
    "TokenRange",
    "choose_table",
    "clear_table_cache",
    "load_dispatch_table",
    "parse_dispatch_table",
    "table_choice_for",
    "table_file_name",
    "served_path",
    "table_path_for",
]

SCHEMA = "qwen36-dispatch/2"
READABLE_SCHEMAS = ("qwen36-dispatch/1", SCHEMA)  # 1: the same ranges, without `timings`
TABLE_ENV = "QWEN36_DISPATCH_TABLE"
DIR_ENV = "QWEN36_DISPATCH_DIR"
CHECKOUT_TABLE_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "dispatch"
# block -> what its ranges count: tokens per call, or sequences per decode step. What each block chooses:
#   moe_experts       a routed-expert path (model.moe.EXPERT_PATHS), wherever the MoE block runs `composed`
#   moe_block         the whole MoE block's path (model.moe.MOE_BLOCK_PATHS): `composed` or a fused block
#   gdn_prefill       a gated-delta-rule path for T > 1 (model.gdn.GDN_RULE_PATHS)
#   gdn_decode        a gated-delta-rule path for one token, wherever the GDN decode layer runs `staged`
#   gdn_layer_decode  the whole GDN layer's decode path (model.gdn.GDN_DECODE_LAYER_PATHS): `staged` or fused
#   gdn_conv          the staged GDN layer's causal conv1d path (model.gdn.CONV_PATHS), by tokens per sequence
#   gdn_gated_norm    the staged GDN layer's gated RMSNorm path (model.norm.rms_norm.GATED_NORM_PATHS), by rows: the
#                     tokens of all sequences of the call (B * T)
#   attention_layer_decode  the whole gated attention layer's decode path over a StaticKVCache
#                     (model.attention.decode_layer.ATTENTION_DECODE_LAYER_PATHS): `staged` or fused
#   add_rms_norm      the residual add + RMSNorm between blocks (model.norm.rms_norm.ADD_RMS_NORM_PATHS),
#                     by rows (B * T)
BLOCKS = {"moe_experts": "tokens", "moe_block": "tokens", "gdn_prefill": "tokens", "gdn_decode": "batch",
          "gdn_layer_decode": "batch", "gdn_conv": "tokens", "gdn_gated_norm": "tokens",
          "attention_layer_decode": "batch", "add_rms_norm": "tokens"}


class DispatchTableError(ValueError):
    """A table file or setting the dispatchers cannot use; the message names the file or variable and the fix."""


@dataclass(frozen=True)
class TokenRange:
    low: int
    high: int | None  # None: no upper bound
    path: str
    # Where `qwen36 tune` timed vLLM's own layer too: this range's time over the other side's, the median of its
    # measured points' `time_ratio` (a model path's over vLLM's; in `vllm_faster`, vLLM's over the model's best;
    # < 1: this range's was faster), for the plugin's status row. None where vLLM's was not timed.
    time_ratio: float | None = None

    def holds(self, n: int) -> bool:
        return self.low <= n and (self.high is None or n <= self.high)


@dataclass(frozen=True)
class DispatchTable:
    device: str
    dtype: str
    blocks: Mapping[str, tuple[TokenRange, ...]]
    source: str  # the file it was read from
    vllm_faster: Mapping[str, tuple[TokenRange, ...]] = field(default_factory=dict)  # path "vllm" in each

    def vllm_faster_for(self, block: str, dtype: torch.dtype | None) -> tuple[TokenRange, ...]:
        """Where vLLM's own layer was timed faster than the table's path (module docstring); none for another
        dtype than the table's."""
        if dtype is not None and str(dtype).removeprefix("torch.") != self.dtype:
            return ()
        return self.vllm_faster.get(block, ())

    def vllm_faster_at(self, block: str, n: int, dtype: torch.dtype | None) -> bool:
        return any(r.holds(n) for r in self.vllm_faster_for(block, dtype))

    def ranges_for(self, block: str, dtype: torch.dtype | None) -> tuple[TokenRange, ...]:
        """The block's ranges, none for another dtype than the table's."""
        if dtype is not None and str(dtype).removeprefix("torch.") != self.dtype:
            return ()
        return self.blocks.get(block, ())

    def path_for(self, block: str, n: int, dtype: torch.dtype | None) -> str | None:
        """The table's path for `n` (tokens or batch, as the block counts), or None outside its ranges or dtype."""
        return next((r.path for r in self.ranges_for(block, dtype) if r.holds(n)), None)


def table_file_name(device_name: str) -> str:
    """"NVIDIA H200" -> "nvidia-h200.json"; "Iluvatar BI-V100" -> "iluvatar-bi-v100.json"."""
    stem = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    if not stem:
        raise DispatchTableError(f"device name {device_name!r} has no letters or digits to name a table file")
    return f"{stem}.json"


def _ranges(source: str, block: str, raw, key: str = "ranges") -> tuple[TokenRange, ...]:
    ranges = raw.get(key) if isinstance(raw, dict) else None
    if key != "ranges" and ranges is None:
        return ()
    if not isinstance(ranges, list) or (key == "ranges" and not ranges):
        raise DispatchTableError(f"{source}: block {block!r} needs a non-empty list `{key}`")
    out: list[TokenRange] = []
    for entry in ranges:
        if key == "vllm_faster" and isinstance(entry, dict):
            entry = {"path": "vllm", **entry}
        try:
            low, high, path = entry["from"], entry["to"], entry["path"]
        except (KeyError, TypeError):
            raise DispatchTableError(f"{source}: {block} range {entry!r} needs `from`, `to` and `path`") from None
        if not isinstance(low, int) or low < 1 or (high is not None and (not isinstance(high, int) or high < low)):
            raise DispatchTableError(f"{source}: {block} range {entry!r}: need 1 <= from <= to (to may be null)")
        if not isinstance(path, str) or not path:
            raise DispatchTableError(f"{source}: {block} range {entry!r}: `path` must name a registered path")
        if out and (out[-1].high is None or low <= out[-1].high):
            raise DispatchTableError(f"{source}: {block} ranges overlap or are out of order at {entry!r}")
        out.append(TokenRange(low, high, path, _median_time_ratio(entry.get("measured"))))
    return tuple(out)


def _median_time_ratio(measured) -> float | None:
    ratios = sorted(e["time_ratio"] for e in (measured if isinstance(measured, list) else ())
                    if isinstance(e, dict) and isinstance(e.get("time_ratio"), (int, float)))
    return ratios[len(ratios) // 2] if ratios else None


def load_dispatch_table(path: str | Path) -> DispatchTable:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise DispatchTableError(f"dispatch table {path} cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise DispatchTableError(f"dispatch table {path} is not JSON ({exc}); rewrite it with `qwen36 tune`") from None
    return parse_dispatch_table(raw, str(path))


def parse_dispatch_table(raw, source: str) -> DispatchTable:
    """A table from its JSON value (`source` names it in errors), checked as a file's is."""
    if not isinstance(raw, dict) or raw.get("schema") not in READABLE_SCHEMAS:
        raise DispatchTableError(f"{source}: schema is {raw.get('schema') if isinstance(raw, dict) else None!r}, "
                                 f"expected one of {READABLE_SCHEMAS}; rewrite it with `qwen36 tune`")
    blocks = raw.get("blocks")
    if not isinstance(blocks, dict):
        raise DispatchTableError(f"{source}: `blocks` must map block names to ranges")
    unknown = sorted(set(blocks) - set(BLOCKS))
    if unknown:
        raise DispatchTableError(f"{source}: unknown blocks {unknown}; known: {sorted(BLOCKS)}")
    for key in ("device", "dtype"):
        if not isinstance(raw.get(key), str):
            raise DispatchTableError(f"{source}: `{key}` must be a string")
    faster = {b: f for b, r in blocks.items() if (f := _ranges(source, b, r, "vllm_faster"))}
    return DispatchTable(raw["device"], raw["dtype"], {b: _ranges(source, b, r) for b, r in blocks.items()}, source,
                         faster)


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, mtime_ns: int) -> DispatchTable:
    return load_dispatch_table(path)


def _load(path: Path) -> DispatchTable:
    return _load_cached(str(path), path.stat().st_mtime_ns)


NVIDIA_DEFAULTS = parse_dispatch_table(
    {"schema": SCHEMA, "device": "NVIDIA GPUs", "dtype": NVIDIA_DEFAULT_DTYPE,
     "blocks": {block: {"ranges": [{"from": lo, "to": hi, "path": path} for lo, hi, path in spans]}
                for block, spans in NVIDIA_DEFAULT_BLOCKS.items()}},
    "model/dispatch/nvidia_defaults.py")
_DEFAULTS_NOTE = "the NVIDIA defaults (model/dispatch/nvidia_defaults.py) serve"


@dataclass(frozen=True)
class TableChoice:
    table: DispatchTable | None
    detail: str  # the table used, or why none is: for the plugin's status row and logs
    fallback: DispatchTable | None = None  # what serves where `table` has no row (NVIDIA GPUs: their defaults)


def _is_nvidia(device_name: str | None) -> bool:
    return device_name is not None and device_name.startswith(NVIDIA_PREFIX)


def choose_table(device_name: str | None, environ: Mapping[str, str] | None = None) -> TableChoice:
    """The table for a device called `device_name` (None: a CPU, or a device not known yet)."""
    env = os.environ if environ is None else environ
    setting = env.get(TABLE_ENV, "").strip()
    if setting.lower() == "off":
        return TableChoice(None, f"{TABLE_ENV}=off: the knobs decide")
    if setting:
        path = Path(setting)
        if not path.is_file():
            raise DispatchTableError(f"{TABLE_ENV}={setting!r} is not a file: give a table written by "
                                     "`qwen36 tune`, or `off`, or unset it for the device's own table")
        fallback = NVIDIA_DEFAULTS if _is_nvidia(device_name) else None
        return TableChoice(_load(path), f"{path} (from {TABLE_ENV})" + (f"; elsewhere {_DEFAULTS_NOTE}" if fallback
                                                                       else ""), fallback)
    if device_name is None:
        return TableChoice(None, f"no device table on a CPU (set {TABLE_ENV} to use one): the knobs decide")
    directory = Path(env.get(DIR_ENV) or CHECKOUT_TABLE_DIR)
    path = directory / table_file_name(device_name)
    nvidia = _is_nvidia(device_name)
    fallback, serving = (NVIDIA_DEFAULTS, _DEFAULTS_NOTE) if nvidia else (None, "the knobs decide")
    if path.is_file():
        return TableChoice(_load(path), str(path) + (f"; where it has no row {_DEFAULTS_NOTE}" if nvidia else ""),
                           fallback)
    if not directory.is_dir():
        return TableChoice(None, f"no table for {device_name}: {directory} does not exist (installed without the "
                                 f"checkout's fixtures/dispatch? set {DIR_ENV} or {TABLE_ENV}): {serving}", fallback)
    return TableChoice(None, f"no table for {device_name} ({path} is missing; record one with `qwen36 tune`): "
                             f"{serving}", fallback)


@functools.lru_cache(maxsize=None)
def _cuda_device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


@functools.lru_cache(maxsize=64)
def _choice_cached(device_type: str, index: int | None, table_setting: str, dir_setting: str) -> TableChoice:
    name = _cuda_device_name(index) if device_type == "cuda" else None
    return choose_table(name, {TABLE_ENV: table_setting, DIR_ENV: dir_setting})


def table_choice_for(device: torch.device | str) -> TableChoice:
    """The table for the device a dispatcher runs on (cached per device and setting: dispatch is hot)."""
    device = torch.device(device)
    index = device.index if device.type != "cuda" or device.index is not None else torch.cuda.current_device()
    return _choice_cached(device.type, index, os.environ.get(TABLE_ENV, ""), os.environ.get(DIR_ENV, ""))


def table_path_for(
    block: str, n: int, device: torch.device | str, dtype: torch.dtype, can_run: Callable[[str], bool]
) -> str | None:
    """The path for `n` on this device: the table's row where it has one that `can_run`, else the device's
    fallback (an NVIDIA GPU's defaults) where that has one; else None (use the knobs)."""
    choice = table_choice_for(device)
    for table in (choice.table, choice.fallback):
        name = None if table is None else table.path_for(block, n, dtype)
        if name is not None and can_run(name):
            return name
    return None


def served_path(paths, block: str, key: int, num_tokens: int, device, dtype, default: str) -> str:
    """The dispatch table's entry for `block` at `key` where `paths` (a model.dispatch.paths.PathTable) can run it for
    `num_tokens` tokens on the call's device and dtype; else `default` (no device or dtype given, no table, or
    an entry that cannot run the input)."""
    if device is None or dtype is None:
        return default
    measured = table_path_for(block, key, device, dtype, lambda name: paths.can_run(name, num_tokens, dtype, device))
    return default if measured is None else measured


def clear_table_cache() -> None:
    """Forget loaded tables and choices (tests, or after rewriting a table in the same process)."""
    _load_cached.cache_clear()
    _choice_cached.cache_clear()
