"""The Triton expert paths' and fused router's properties in CI, on the CPU through Triton's interpreter.

The interpreter is chosen when the kernels are defined, from TRITON_INTERPRET in the environment, so the
checks (tests/numerics/triton_interpreter_checks.py) run in a fresh interpreter process with it set; this
suite's own processes keep compiled Triton, where the paths are unavailable on the CPU. One test per path
(the router's checks are named `triton_fused`), so pytest-xdist runs them in parallel.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.numerics.interpreter_run import run_under_interpreter

CHECKS = Path(__file__).with_name("triton_interpreter_checks.py")
TRITON_PATHS = ("triton_decode", "triton_grouped", "triton_fused")


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _has_triton(), reason="triton is not installed")
@pytest.mark.parametrize("name", TRITON_PATHS)
def test_triton_path_properties_under_the_interpreter(name):
    run_under_interpreter(CHECKS, name)
