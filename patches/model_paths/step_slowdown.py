"""A test-only switch that makes this server's own engine steps slower by a set fraction.

It is how the perf gates measure what they can see (docs/perf-gates.md): a regression of a known size,
inside the server process, with nothing between the server and the client. It is not a patch of the set
(patches/catalog.py): `QWEN36_PATCHES=all` never turns it on, and `qwen36 presubmit` refuses a run config that
sets it.

- `QWEN36_TEST_STEP_SLOWDOWN`: `0.15` (every step 15% longer), `decode=0.2` (only the steps that schedule one
  token per request), `prefill=0.3` (the steps that prefill, chunks of a prompt included), or both,
  `decode=0.1,prefill=0.2`. Unset or 0: no step is touched.
- `QWEN36_TEST_STEP_SLOWDOWN_FILE`: a file holding the same text, read again whenever it is replaced, so one
  server serves an A/A control and several sizes without a restart. A missing or empty file is no slowdown;
  where both are set, the file wins once it exists. Write it by replacing it (harness.serving's
  `set_step_slowdown` writes a new file and renames it over the old one), so a step never reads half a file.

How: the engine core's step (its `step_fn`: schedule, run the model in the worker, sample, update the requests)
is timed, and the engine core then spins for fraction x elapsed before the step's outputs are handed on, so the
step takes (1 + fraction) times as long and its tokens come out that much later. The core stays busy, as slower
work keeps it; the outputs are the model's own. A step prefills when its scheduler output schedules more tokens
than requests (read from the scheduler's `schedule`). Both are wrapped on the engine loop's first step
(`EngineCoreProc._process_engine_step`), whatever the order vLLM loads plugins and builds the engine in.
Measured on the tiny CPU model (2026-12-03), two other places slowed less, or other things, than the fraction
says: a slowed worker forward pass (`decode=0.3` moved Output TPS P10 by 10%), and a spin after the outputs were
handed on (a prefill's spin then fell into the first gap between tokens: official-like's TPOT rose 70%).
A change of slowdown is logged, so a test can see it took effect.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

from ..core.imports import when_imported

__all__ = ["SLOWDOWN_ENV", "SLOWDOWN_FILE_ENV", "Slowdown", "SlowdownSource", "parse_slowdown", "install",
           "is_installed"]

SLOWDOWN_ENV = "QWEN36_TEST_STEP_SLOWDOWN"
SLOWDOWN_FILE_ENV = "QWEN36_TEST_STEP_SLOWDOWN_FILE"
# The largest fraction accepted: the gate's tests use 0.1 to 1 (CI injects 1, twice as slow); 3 (4x slower) is far
# beyond any use.
MAX_FRACTION = 3.0
_KINDS = ("decode", "prefill")
_WRAPPED = "__qwen36_step_slowdown__"
_log = logging.getLogger("vllm.qwen36.patches")


class SlowdownError(ValueError):
    """A slowdown text the switch cannot use; the message names it and the fix."""


@dataclass(frozen=True)
class Slowdown:
    decode: float = 0.0
    prefill: float = 0.0

    @property
    def off(self) -> bool:
        return self.decode == 0 and self.prefill == 0

    def fraction(self, prefill: bool) -> float:
        return self.prefill if prefill else self.decode

    def describe(self) -> str:
        return f"decode={self.decode:g},prefill={self.prefill:g}"


def parse_slowdown(text: str, where: str = SLOWDOWN_ENV) -> Slowdown:
    """`0.15`, `decode=0.2`, `prefill=0.3`, `decode=0.1,prefill=0.2`; empty is no slowdown."""
    text = text.strip()
    if not text:
        return Slowdown()
    fix = (f"give a fraction of a step's time, 0 to {MAX_FRACTION:g}, for every step (0.15) or by kind "
           "(decode=0.2, prefill=0.3, or both: decode=0.1,prefill=0.2)")
    values: dict[str, float] = {}
    for part in text.split(","):
        kind, eq, number = part.partition("=")
        kinds = [kind.strip()] if eq else list(_KINDS)
        try:
            value = float(number if eq else kind)
        except ValueError:
            raise SlowdownError(f"{where}={text!r}: {part.strip()!r} is not a number; {fix}") from None
        if any(k not in _KINDS for k in kinds):
            raise SlowdownError(f"{where}={text!r}: {kind.strip()!r} is not a kind of step; {fix}")
        if not 0 <= value <= MAX_FRACTION:
            raise SlowdownError(f"{where}={text!r}: {value:g} is out of range; {fix}")
        values.update(dict.fromkeys(kinds, value))
    return Slowdown(**values)


@dataclass(frozen=True)
class SlowdownSource:
    """Where the engine reads its slowdown: a fixed one (the variable), or a file that may change."""
    fixed: Slowdown = Slowdown()
    path: str | None = None

    @property
    def never(self) -> bool:
        """Nothing to install: no file to watch and no fixed slowdown."""
        return self.path is None and self.fixed.off

    @classmethod
    def from_env(cls, environ) -> "SlowdownSource":
        return cls(parse_slowdown(environ.get(SLOWDOWN_ENV, "")), environ.get(SLOWDOWN_FILE_ENV) or None)


class _Current:
    """The slowdown in force: the file's when it exists (read again when replaced), else the fixed one."""

    def __init__(self, source: SlowdownSource):
        self.source = source
        self.stamp: tuple | None = None
        self.value = source.fixed
        self.refresh()

    def refresh(self) -> Slowdown:
        if self.source.path is None:
            return self.value
        try:
            st = os.stat(self.source.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp != self.stamp:
            self.stamp = stamp
            before = self.value
            try:
                with open(self.source.path) as f:
                    self.value = parse_slowdown(f.read(), self.source.path)
            except FileNotFoundError:
                self.value = self.source.fixed
            except (OSError, SlowdownError) as exc:  # keep the last good one; say why
                _log.error("qwen36: test step slowdown: %s; keeping %s", exc, self.value.describe())
            if self.value != before:
                _log.warning("qwen36: TEST-ONLY step slowdown now %s (pid %d)", self.value.describe(), os.getpid())
        return self.value


def _is_prefill(scheduler_output) -> bool:
    """A step that schedules more tokens than requests prefills (a prompt or a chunk of one)."""
    per_request = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    return getattr(scheduler_output, "total_num_scheduled_tokens", 0) > len(per_request)


def _spin(seconds: float) -> None:
    """Busy, as a slower kernel keeps the core (a sleep would hand the core to the other processes)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def _wrap(method: Callable, current: _Current) -> Callable:
    """The engine loop's step method, which on its first call slows this engine's `step_fn` (the step itself:
    schedule, execute, update) and records the kind of each step its scheduler schedules."""
    def first_slows(self, *args, **kwargs):
        if not getattr(self, "_qwen36_step_slowed", False):
            kind = _record_kind(self.scheduler)
            self.step_fn = _slowed(self.step_fn, current, kind)
            self._qwen36_step_slowed = True
        return method(self, *args, **kwargs)

    setattr(first_slows, _WRAPPED, method)
    first_slows.__name__, first_slows.__doc__ = method.__name__, method.__doc__
    return first_slows


def _slowed(step: Callable, current: _Current, kind: list[bool]) -> Callable:
    """`step`, then a spin of fraction x its time, before its outputs are handed on: a slower step."""
    def slowed_step(*args, **kwargs):
        slowdown = current.refresh()
        began = time.perf_counter()
        out = step(*args, **kwargs)
        fraction = slowdown.fraction(kind[0])
        if fraction:
            _spin(fraction * (time.perf_counter() - began))
        return out

    return slowed_step


def _record_kind(scheduler) -> list[bool]:
    """[whether the scheduler's latest step prefills], kept up to date by wrapping its `schedule`."""
    kind = [False]
    schedule = scheduler.schedule

    def recorded(*args, **kwargs):
        output = schedule(*args, **kwargs)
        kind[0] = _is_prefill(output)
        return output

    scheduler.schedule = recorded
    return kind


ENGINE_MODULE = "vllm.v1.engine.core"  # the engine core process's module; `EngineCoreProc` runs the step loop
ENGINE_CLASS = "EngineCoreProc"
ENGINE_STEP = "_process_engine_step"


def install(source: SlowdownSource, engine_cls=None) -> bool:
    """Wrap the engine class's step when `source` can slow a step; idempotent. Without `engine_cls`, vLLM's engine
    core is wrapped where its module is imported: now if it already is, else when the process imports it. Returns
    whether the wrapper is in place or will be."""
    if source.never:
        return False
    if engine_cls is not None:
        _wrap_class(engine_cls, source)
        return True
    when_imported(ENGINE_MODULE, lambda module: _wrap_class(getattr(module, ENGINE_CLASS), source))
    return True


def _wrap_class(engine_cls, source: SlowdownSource) -> None:
    if is_installed(engine_cls):
        return
    current = _Current(source)
    setattr(engine_cls, ENGINE_STEP, _wrap(getattr(engine_cls, ENGINE_STEP), current))
    _log.warning("qwen36: TEST-ONLY step slowdown installed in pid %d (%s, file %s): this server's steps are "
                 "deliberately slowed while it is on", os.getpid(), current.value.describe(), source.path)


def is_installed(engine_cls) -> bool:
    return hasattr(engine_cls.__dict__.get(ENGINE_STEP), _WRAPPED)
