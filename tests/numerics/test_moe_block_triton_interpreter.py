"""The fused MoE block path's properties in CI, on the CPU through Triton's interpreter.

The interpreter is chosen when the kernels are defined, from TRITON_INTERPRET in the environment, so the checks
(tests/numerics/moe_block_interpreter_checks.py) run in a fresh interpreter process with it set; this suite's
own processes keep compiled Triton, where the path is unavailable on the CPU (test_moe_block_paths.py says so).
The hypothesis profile travels to the subprocess.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.numerics.interpreter_run import run_under_interpreter

CHECKS = Path(__file__).with_name("moe_block_interpreter_checks.py")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_fused_block_properties_under_the_interpreter():
    run_under_interpreter(CHECKS)
