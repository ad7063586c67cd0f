"""A synthetic history: a git repository of N commits and records over it, with a planted step at a known commit.

Two machine kinds, two metrics: a lower-is-better time and a higher-is-better throughput. From commit STEP_AT on,
the time is 15% higher and the throughput 15% lower on the CPU kind only; the GPU kind stays flat. Each value has a
small deterministic wobble (well inside the thresholds) and a spread around it.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from harness.history.record import Figure, Machine, Record

COMMITS = 12
STEP_AT = 7  # the first slower commit (0-based)
STEP = 0.15
CPU = Machine("cpu: SyntheticVendor family 1 model 2, avx2", "synthetic")
GPU = Machine("gpu: Synthetic G100", "synthetic")
TIME, TPS = "synthetic.decode.step_us", "synthetic.decode.output_tps_p10"
WOBBLE = (0.0, 0.01, -0.008, 0.004, -0.012, 0.006, -0.003, 0.009, -0.005, 0.002, -0.01, 0.007)


def make_repo(root: Path, branch: str = "main") -> list[str]:
    """A repository at `root` with COMMITS commits on `branch`, a day apart; returns their hashes, oldest first."""
    root.mkdir(parents=True, exist_ok=True)

    def git(*args: str, date: str | None = None) -> str:
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@localhost", "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(root)}
        if date:
            env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        return subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q", "-b", branch)
    hashes = []
    for i in range(COMMITS):
        (root / "file.txt").write_text(f"commit {i}\n")
        git("add", "file.txt")
        git("commit", "-q", "-m", f"commit {i}", date=f"2026-11-{i + 1:02d}T12:00:00+00:00")
        hashes.append(git("rev-parse", "HEAD"))
    return hashes


def records(hashes: list[str]) -> list[Record]:
    out = []
    for i, commit in enumerate(hashes):
        for machine, base_time, base_tps, steps in ((CPU, 20_000.0, 50.0, True), (GPU, 2_000.0, 400.0, False)):
            factor = (1 + STEP) if steps and i >= STEP_AT else 1.0
            time = base_time * factor * (1 + WOBBLE[i])
            tps = base_tps / factor * (1 - WOBBLE[i])
            figures = (Figure(TIME, time, "us", "lower", time * 0.98, time * 1.02, "IQR of 20 steps", 0.05),
                       Figure(TPS, tps, "tok/s", "higher", tps * 0.97, tps * 1.03, "min..max of 16 pairs", 0.05))
            out.append(Record("synthetic", f"2026-11-{i + 1:02d}T13:00:00", commit, "synthetic", machine,
                              "python -m tests.history.synthetic", f"runs/synthetic/{i}.json", figures))
    return out
