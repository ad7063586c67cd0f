"""The Triton norm paths' property in CI, on the CPU through Triton's interpreter.

The interpreter is chosen when the kernels are defined, from TRITON_INTERPRET in the environment, so the
checks (tests/numerics/norm_interpreter_checks.py) run in a fresh interpreter process with it set; this
suite's own processes keep compiled Triton, where test_norm.py skips the paths and names this file. One
test per norm, so pytest-xdist runs them in parallel; the hypothesis profile travels to the subprocess.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.numerics.interpreter_run import run_under_interpreter

CHECKS = Path(__file__).with_name("norm_interpreter_checks.py")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.parametrize("kind", ["zero_centred", "gated"])
def test_triton_norm_properties_under_the_interpreter(kind):
    # `-k` keeps the one norm's tests and the common ones (kind-free names select under both).
    run_under_interpreter(CHECKS, f"{kind} or not (zero_centred or gated)")
