"""The fused MoE block path's properties in CI, on the CPU through Triton's interpreter.

The interpreter is chosen when the kernels are defined, from TRITON_INTERPRET in the environment, so the checks
(tests/numerics/moe_block_interpreter_checks.py) run in a fresh interpreter process with it set; this suite's
own processes keep compiled Triton, where the path is unavailable on the CPU (test_moe_block_paths.py says so).
The hypothesis profile travels to the subprocess.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[2]
CHECKS = Path(__file__).with_name("moe_block_interpreter_checks.py")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_fused_block_properties_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", HYPOTHESIS_PROFILE=settings.get_current_profile_name())
    cmd = [sys.executable, "-m", "pytest", str(CHECKS), "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    # Exit status 0 needs at least one collected test that passed (pytest exits 5 when nothing is collected).
    assert result.returncode == 0, f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-3000:]
