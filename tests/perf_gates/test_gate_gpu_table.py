"""The GPU perf gate under `pytest -m gpu`: `qwen36 tune --check` on this device against its dispatch table's
timings (docs/tuning.md). It fails, never skips, on a GPU without a table for it: the failure names the command
that records one. About a minute on an H200 (three sweeps); `timing`, so `make test` runs it alone.

With GPU_REPORT_DIR set, the check's report goes to $GPU_REPORT_DIR/tune-check/."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timing, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_every_dispatched_path_the_moe_block_and_the_gdn_layer_hold_their_recorded_times(tmp_path):
    report = Path(os.environ["GPU_REPORT_DIR"]) / "tune-check" if os.environ.get("GPU_REPORT_DIR") else tmp_path
    # A process of its own: the check times from a cold start as it was recorded, and nothing this pytest
    # process loaded (other tests' kernels, allocator state) is in its timings.
    done = subprocess.run([sys.executable, "-m", "harness.tune", "--check", "--no-progress", "--report-dir",
                           str(report)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"qwen36 tune --check exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
