"""The `triton` attention decode layer path's property in CI, on the CPU through Triton's interpreter.

The interpreter is chosen when the kernel is defined, from TRITON_INTERPRET in the environment, so the checks
(tests/numerics/attention_decode_interpreter_checks.py: the property in float32, bf16 and float16, the cache
written at one position only, the bits repeated, and broken kernels it must reject) run in a fresh interpreter
process with it set; this suite's own processes keep compiled Triton, where test_attention_decode_layer.py skips
the path and names this file. The hypothesis profile travels to the subprocess.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.numerics.interpreter_run import run_under_interpreter

CHECKS = Path(__file__).with_name("attention_decode_interpreter_checks.py")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_attention_decode_layer_properties_under_the_interpreter():
    run_under_interpreter(CHECKS)
