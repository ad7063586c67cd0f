"""tools/step_host_profile.py at tiny dims on a CPU, run as a person runs it: every timed step is there, the
forced paths are the ones recorded, and the profile's own time is split by where the code lives."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.paths import REPO_ROOT


def test_writes_every_step_and_the_profile_by_origin(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "step_host_profile.py"), "--dims", "tiny", "--device", "cpu",
         "--prefill", "4", "--batch", "2", "--steps", "3", "--profile-steps", "2", "--paths", "norm=fused",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "step-host-b2.json").read_text())
    assert result["batch"] == 2 and result["paths"] == {"norm": "fused"}
    assert len(result["eager_ms"]) == len(result["host_ms"]) == 3
    assert all(ms > 0 for ms in result["host_ms"])
    origins = result["profile_own_ms_per_step_by_origin"]
    assert origins["model (this repository)"] > 0 and origins["torch ops (C++)"] > 0
    assert "model/qwen36/model.py" in (tmp_path / "step-host-b2-profile.txt").read_text()
