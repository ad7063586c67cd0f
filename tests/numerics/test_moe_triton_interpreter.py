"""The Triton expert paths' and fused router's properties in CI, on the CPU through Triton's interpreter.

The interpreter is chosen when the kernels are defined, from TRITON_INTERPRET in the environment, so the
checks (tests/numerics/triton_interpreter_checks.py) run in a fresh interpreter process with it set; this
suite's own processes keep compiled Triton, where the paths are unavailable on the CPU. One test per path
(the router's checks are named `triton_fused`), so pytest-xdist runs them in parallel.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[2]
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
    env = dict(os.environ, TRITON_INTERPRET="1", HYPOTHESIS_PROFILE=settings.get_current_profile_name())
    cmd = [sys.executable, "-m", "pytest", str(CHECKS), "-k", name, "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    # Exit status 0 needs at least one collected test that passed (pytest exits 5 when nothing is collected).
    assert result.returncode == 0, f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-3000:]
