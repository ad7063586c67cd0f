"""The Triton residual add + RMSNorm path's property in CI, on the CPU through Triton's interpreter.

The interpreter is chosen when the kernels are defined, from TRITON_INTERPRET in the environment, so the checks
(tests/numerics/add_rms_norm_interpreter_checks.py: bit equality with torch's `h + y` and the RMSNorm kernel of it,
the float64 bounds, the rounding edges, the kernel mutants) run in a fresh interpreter process with it set; this
suite's own processes keep compiled Triton, where test_add_rms_norm.py skips the path and names this file. The
hypothesis profile travels to the subprocess.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.numerics.interpreter_run import run_under_interpreter

CHECKS = Path(__file__).with_name("add_rms_norm_interpreter_checks.py")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_add_rms_norm_properties_under_the_interpreter():
    run_under_interpreter(CHECKS)
