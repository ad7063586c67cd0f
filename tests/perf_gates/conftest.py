"""Fixtures of the embedded-server perf gate tests (test_gate_tiny_server.py, test_gate_no_cache.py); the
regressed servers are tests/conftest.py's `regressed_servers`."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def embedded_server_only(pytestconfig):
    """For the modules that start, load and regress the embedded server on this machine; against --server-url
    the live gate (test_gate_live.py) is the one that applies."""
    if pytestconfig.getoption("--server-url"):
        pytest.skip("the embedded-server gate tests do not apply to --server-url (test_gate_live.py does)")
