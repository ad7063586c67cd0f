"""The decode step's launch budget per block on the few-launch paths, in CI, on the CPU through Triton's
interpreter (tests/numerics/step_launch_checks.py, run in a fresh process with TRITON_INTERPRET=1)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.numerics.interpreter_run import run_under_interpreter

CHECKS = Path(__file__).with_name("step_launch_checks.py")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_decode_step_launches_under_the_interpreter():
    run_under_interpreter(CHECKS)
