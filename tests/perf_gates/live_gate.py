"""Run tests/perf_gates/test_gate_live.py in its own pytest against a server known only by its URL, as a user
on another machine runs it, and find the run directory its bench wrote."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.paths import REPO_ROOT

LIVE_TESTS = REPO_ROOT / "tests/perf_gates/test_gate_live.py"


@dataclass(frozen=True)
class LiveGateRun:
    """A nested live-gate pytest: how it ended, and the run directory its bench wrote."""
    process: subprocess.CompletedProcess
    run: Path

    def failed(self, metric: str) -> bool:
        """Whether the metric's test is in the summary's failures (-q names only failures)."""
        return f"FAILED tests/perf_gates/test_gate_live.py::test_live_server_does_not_regress[{metric}]" in \
            self.process.stdout

    def output(self) -> str:
        return self.process.stdout[-5000:] + self.process.stderr[-2000:]


def live_gate(url: str, profile: str, out: Path, repeats: int, tokenizer: Path, baselines: Path | None = None,
              accept: tuple[str, ...] = (), machine_speed: bool = True) -> LiveGateRun:
    """`baselines`: the directory holding `profile` (default: the committed fixtures/baselines); `accept`:
    identity fields not compared (--accept-difference); `machine_speed` False: --no-machine-speed. The tokenizer
    is the model's, as a user who has the model's files gives it."""
    cmd = [sys.executable, "-m", "pytest", str(LIVE_TESTS), "-p", "no:cacheprovider", "-q", "-s",
           "--server-url", url, "--baseline-profile", profile, "--gate-repeats", str(repeats),
           "--tokenizer", str(tokenizer), f"--basetemp={out}"]
    if baselines is not None:
        cmd += ["--baselines-dir", str(baselines)]
    if accept:
        cmd += ["--accept-difference", ",".join(accept)]
    if not machine_speed:
        cmd += ["--no-machine-speed"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(cmd, check=False, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    print(done.stdout[-3000:])
    runs = sorted({run.resolve() for run in out.glob(f"live*/*-gate-{profile}")})  # livecurrent: a link
    assert len(runs) == 1, f"the nested pytest wrote {len(runs)} runs under {out}:\n" + done.stdout[-3000:] + \
        done.stderr[-2000:]
    return LiveGateRun(done, runs[0])
