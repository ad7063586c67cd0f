"""Running a checks module under Triton's CPU interpreter, for the `test_*_interpreter.py` launchers.

The interpreter is chosen when a kernel is defined, from TRITON_INTERPRET in the environment, so the checks run in
a fresh interpreter process with it set; the suite's own processes keep compiled Triton. The hypothesis profile
travels to the subprocess.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import settings

__all__ = ["REPO", "run_under_interpreter"]

REPO = Path(__file__).resolve().parents[2]


def run_under_interpreter(checks: Path, select: str | None = None) -> None:
    """Run `checks` (a pytest module not collected by the suite) with TRITON_INTERPRET=1, keeping the tests `-k
    select` picks; fail unless at least one ran and every one passed (none skipped)."""
    env = dict(os.environ, TRITON_INTERPRET="1", HYPOTHESIS_PROFILE=settings.get_current_profile_name())
    cmd = [sys.executable, "-m", "pytest", str(checks), *(["-k", select] if select else []),
           "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    # Exit status 0 needs at least one collected test that passed (pytest exits 5 when nothing is collected).
    assert result.returncode == 0, f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-3000:]
