"""The test-only step slowdown (patches/model_paths/step_slowdown.py): its text, its effect on an engine's step time by
kind of step, a file that changes while the server runs, and that the platform's patch set never turns it on."""
from __future__ import annotations

import os
import sys
import time
import types
from dataclasses import dataclass, field

import pytest

from patches.model_paths import step_slowdown
from patches.model_paths.step_slowdown import Slowdown, SlowdownSource, parse_slowdown
from patches.settings import PatchSettings, PatchSettingsError

# The fake step's own time, on the fake clock below.
STEP_S = 0.02


class FakeClock:
    """time.perf_counter for the slowdown: the fake step advances it by STEP_S, a spin by what it was asked for,
    so the tests read exact step times whatever else the machine does (the parallel suite shares two cores)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()

    def spin(seconds: float) -> None:
        fake.now += seconds

    monkeypatch.setattr(step_slowdown.time, "perf_counter", fake.perf_counter)
    monkeypatch.setattr(step_slowdown, "_spin", spin)
    return fake


@pytest.mark.parametrize(("text", "expected"), [
    ("", Slowdown()), ("0", Slowdown()), ("0.15", Slowdown(0.15, 0.15)), ("decode=0.2", Slowdown(decode=0.2)),
    ("prefill=0.3", Slowdown(prefill=0.3)), (" decode=0.1 , prefill=0.2 ", Slowdown(0.1, 0.2)),
])
def test_slowdown_text_reads_a_fraction_for_every_step_or_by_kind(text, expected):
    assert parse_slowdown(text) == expected


@pytest.mark.parametrize(("text", "names"), [
    ("fast", "'fast' is not a number"), ("sample=0.2", "'sample' is not a kind of step"),
    ("-0.1", "out of range"), ("decode=4", "out of range"),
])
def test_a_bad_slowdown_text_is_refused_with_the_accepted_forms(text, names):
    with pytest.raises(step_slowdown.SlowdownError, match=names) as err:
        parse_slowdown(text)
    assert "decode=0.2" in str(err.value)  # the fix: what it accepts


def test_the_settings_refuse_a_bad_slowdown_with_the_variable_named():
    with pytest.raises(PatchSettingsError, match=step_slowdown.SLOWDOWN_ENV):
        PatchSettings.from_env({step_slowdown.SLOWDOWN_ENV: "fast"})


def test_the_whole_patch_set_never_turns_the_slowdown_on():
    settings = PatchSettings.from_env({"QWEN36_PATCHES": "all"})
    assert settings.step_slowdown.never
    assert not step_slowdown.install(settings.step_slowdown)


@dataclass
class SchedulerOutput:
    num_scheduled_tokens: dict = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0


DECODE = SchedulerOutput({"r1": 1, "r2": 1}, 2)
PREFILL = SchedulerOutput({"r1": 1, "r2": 37}, 38)  # one request decodes while another prefills


def fake_engine_class(clock: FakeClock):
    """vLLM's engine core as far as the slowdown sees it: a loop step that runs `step_fn` (schedule, then STEP_S of
    work on the fake clock) and hands its outputs on."""
    class Scheduler:
        def __init__(self):
            self.next = DECODE

        def schedule(self, throttle=False):
            return self.next

    class EngineCoreProc:
        def __init__(self):
            self.scheduler = Scheduler()
            self.step_fn = self.step  # bound when the engine is built, as vLLM does
            self.handed_on: list[tuple] = []

        def step(self):
            out = self.scheduler.schedule(False)
            clock.now += STEP_S
            return ("executed", out.total_num_scheduled_tokens)

        def _process_engine_step(self):
            outputs = self.step_fn()
            self.handed_on.append((outputs, clock.now))
            return True
    return EngineCoreProc


def step_time(engine, scheduler_output, clock: FakeClock) -> float:
    """From a loop step's start to its outputs being handed on."""
    engine.scheduler.next = scheduler_output
    began = clock.now
    engine._process_engine_step()
    return engine.handed_on[-1][1] - began


def test_a_slowdown_lengthens_only_its_kind_of_step_by_its_fraction_and_keeps_the_output(clock):
    cls = fake_engine_class(clock)
    assert step_slowdown.install(SlowdownSource(Slowdown(decode=0.5)), cls)
    engine = cls()
    engine._process_engine_step()
    assert engine.handed_on[-1][0] == ("executed", 2)  # the step's own outputs
    assert step_time(engine, DECODE, clock) == pytest.approx(1.5 * STEP_S)
    assert step_time(engine, PREFILL, clock) == pytest.approx(STEP_S)


def test_installing_twice_wraps_once(clock):
    cls = fake_engine_class(clock)
    step_slowdown.install(SlowdownSource(Slowdown(0.5, 0.5)), cls)
    step_slowdown.install(SlowdownSource(Slowdown(0.5, 0.5)), cls)
    assert step_time(cls(), DECODE, clock) == pytest.approx(1.5 * STEP_S)


def test_a_slowdown_file_changes_the_step_time_while_the_engine_runs(tmp_path, clock):
    path = tmp_path / "slowdown"
    cls = fake_engine_class(clock)
    step_slowdown.install(SlowdownSource(path=str(path)), cls)
    engine = cls()
    assert step_time(engine, PREFILL, clock) == pytest.approx(STEP_S)  # no file yet: no slowdown

    def replace(text: str) -> None:
        (tmp_path / "new").write_text(text)
        os.replace(tmp_path / "new", path)

    replace("prefill=1")
    assert step_time(engine, PREFILL, clock) == pytest.approx(2 * STEP_S)
    replace("")
    assert step_time(engine, PREFILL, clock) == pytest.approx(STEP_S)
    replace("not a number")  # a bad file keeps the last good value, and says why in the log
    assert step_time(engine, PREFILL, clock) == pytest.approx(STEP_S)


def test_an_engine_built_before_the_wrapper_is_slowed_too(clock):
    cls = fake_engine_class(clock)
    engine = cls()  # step_fn bound to the plain step already
    step_slowdown.install(SlowdownSource(Slowdown(0.5, 0.5)), cls)
    assert step_time(engine, DECODE, clock) == pytest.approx(1.5 * STEP_S)


@pytest.mark.timing  # CPU time against wall time: run alone, where the spin gets its core
def test_the_spin_keeps_the_core_busy_for_as_long_as_asked(monkeypatch):
    monkeypatch.undo()  # the real clock and spin
    began_cpu, began = time.process_time(), time.perf_counter()
    step_slowdown._spin(0.05)
    assert time.perf_counter() - began >= 0.05
    spun_cpu = time.process_time() - began_cpu
    began_cpu = time.process_time()
    time.sleep(0.05)
    slept_cpu = time.process_time() - began_cpu
    # Busy, not asleep: a sleep takes next to no CPU time. How much the spin gets depends on the load: beside the
    # parallel run's servers one got 6 ms of its 50 (a fresh-clone run, 2026-12-03), so no share is asserted.
    assert spun_cpu > 0.002 and spun_cpu > 10 * slept_cpu, (spun_cpu, slept_cpu)


def test_the_engine_module_is_wrapped_when_it_is_imported_not_before(monkeypatch, tmp_path):
    name = "qwen36_fake_engine_module"
    (tmp_path / f"{name}.py").write_text(
        "class EngineCoreProc:\n"
        "    def _process_engine_step(self):\n"
        "        return True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(step_slowdown, "ENGINE_MODULE", name)
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert step_slowdown.install(SlowdownSource(Slowdown(0.5, 0.5)))
    assert name not in sys.modules  # installing imports nothing: a process that never runs a step never pays
    module = __import__(name)
    try:
        assert step_slowdown.is_installed(module.EngineCoreProc)
    finally:
        sys.modules.pop(name, None)


def test_a_module_already_imported_is_wrapped_at_once(monkeypatch):
    module = types.ModuleType("qwen36_fake_loaded_engine")
    module.EngineCoreProc = fake_engine_class(FakeClock())
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(step_slowdown, "ENGINE_MODULE", module.__name__)
    step_slowdown.install(SlowdownSource(Slowdown(0.2, 0.2)))
    assert step_slowdown.is_installed(module.EngineCoreProc)
