"""The `triton` GDN decode layer path's property in CI, on the CPU through Triton's interpreter.

The interpreter is chosen when the kernel is defined, from TRITON_INTERPRET in the environment, so the checks
(tests/numerics/gdn_decode_interpreter_checks.py: the property in float32, bf16 and float16, aliased and not,
and broken kernels it must reject) run in a fresh interpreter process with it set; this suite's own processes
keep compiled Triton, where test_gdn_decode_layer.py skips the path and names this file. The hypothesis
profile travels to the subprocess.
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
CHECKS = Path(__file__).with_name("gdn_decode_interpreter_checks.py")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_gdn_decode_layer_properties_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", HYPOTHESIS_PROFILE=settings.get_current_profile_name())
    cmd = [sys.executable, "-m", "pytest", str(CHECKS), "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    # Exit status 0 needs at least one collected test that passed (pytest exits 5 when nothing is collected).
    assert result.returncode == 0, f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-3000:]
