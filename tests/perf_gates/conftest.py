"""Fixtures of the embedded-server perf gate tests (test_gate_tiny_server.py, test_gate_no_cache.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.gates.regressions import acquire_regressed
from harness.shared_server import STATE_ENV, ServerInfo


@pytest.fixture(scope="module")
def embedded_server_only(pytestconfig):
    """For the modules that start, load and regress the embedded server on this machine; against --server-url
    the live gate (test_gate_live.py) is the one that applies."""
    if pytestconfig.getoption("--server-url"):
        pytest.skip("the embedded-server gate tests do not apply to --server-url (test_gate_live.py does)")


@pytest.fixture(scope="session")
def regressed_servers(openai_server) -> dict[str, ServerInfo]:
    """The servers of harness.gates.regressions (eager, no-cache, slow-prefill), by name. Under `make test`
    they start during the parallel run (harness.suite_session); otherwise they start here, together, the first
    time a test asks. Idle, a vLLM server's processes nearly sleep (docs/perf-gates.md: ~2% of a core each)."""
    state_dir = os.environ.get(STATE_ENV)
    if not state_dir:
        pytest.fail(f"{STATE_ENV} is not set: tests/conftest.py's pytest_configure did not run in the controller")
    return acquire_regressed(Path(state_dir), openai_server.model_dir)
