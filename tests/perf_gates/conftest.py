"""Fixtures of the embedded-server perf gate tests (test_gate_paired.py, test_gate_no_cache.py); the servers they
compare are tests/conftest.py's `compared_servers` and `reference_server`."""
from __future__ import annotations

import pytest

# Every paired verdict of the run, passed or not, for the end of the terminal report: CI's log is where a run's
# figures survive it (the interleaved run's directory goes with pytest's temporary files), and passing runs'
# figures are what a tolerance or a design is judged on.
PAIRED_REPORTS = pytest.StashKey[list]()


@pytest.fixture(scope="session")
def paired_reports(pytestconfig) -> list[str]:
    """Append a paired report's Markdown here to have it printed at the end of the run."""
    return pytestconfig.stash.setdefault(PAIRED_REPORTS, [])


def pytest_terminal_summary(terminalreporter, config) -> None:
    reports = config.stash.get(PAIRED_REPORTS, [])
    if reports:
        terminalreporter.section("paired perf gates: every verdict of this run, passed or not")
        for text in reports:
            terminalreporter.write_line(text)


@pytest.fixture(scope="module")
def embedded_server_only(pytestconfig):
    """For the modules that start, compare and slow the embedded servers on this machine; against --server-url
    the live gate (test_gate_live.py) is the one that applies."""
    if pytestconfig.getoption("--server-url"):
        pytest.skip("the embedded-server gate tests do not apply to --server-url (test_gate_live.py does)")
