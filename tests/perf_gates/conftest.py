"""Fixtures of the embedded-server perf gate tests (test_gate_paired.py, test_gate_no_cache.py); the servers they
compare are tests/conftest.py's `compared_servers` and `reference_server`."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def embedded_server_only(pytestconfig):
    """For the modules that start, compare and slow the embedded servers on this machine; against --server-url
    the live gate (test_gate_live.py) is the one that applies."""
    if pytestconfig.getoption("--server-url"):
        pytest.skip("the embedded-server gate tests do not apply to --server-url (test_gate_live.py does)")
