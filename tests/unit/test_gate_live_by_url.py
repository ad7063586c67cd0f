"""The live gate (tests/perf_gates/test_gate_live.py) as a user on another machine runs it: a nested pytest that
knows the server only by its URL, against a profile recorded by URL. The servers are synthetic (their timing is
scheduled, the same on any machine), so this proves the gate's path, not a server's speed: a same server passes, a
slower one fails on its metric, a run the gate refuses fails every test with one line that says why, and a server
that wants a key fails with the fix until the key is given."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.bench.run import PRESETS, BenchConfig, run_bench
from harness.bench.client import API_KEY_FIX
from harness.gates.baseline import save_baseline
from harness.gates.record import baseline_from_runs
from harness.paths import REPO_ROOT
from tests.unit.synthetic_server import SyntheticServer, normal_stream

# The verdicts on timing run alone (`timing`): beside the parallel run's server starts the recording's own
# repeats read TTFT P90 with a 184% spread and a same server's weighted throughput -11% (fresh-clone runs ci7 and
# ci10, 2026-12-03). The refusal compares no times and stays in the parallel run.
pytestmark = pytest.mark.slow
PROFILE, PRESET = "synthetic", "bi-v100-ledger"  # the smallest preset: 8 official-like requests at c=1
KEY = "sk-synthetic-test-key"


def synthetic(gap_s: float, api_key: str | None = None) -> SyntheticServer:
    # One model name for every server, as one deployment has: the gate compares the model's name too.
    return SyntheticServer({"synthetic": normal_stream(ttft_s=0.03, gap_s=gap_s, tokens=12)}, api_key=api_key)


@pytest.fixture(scope="module")
def baselines(tmp_path_factory) -> Path:
    """A profile recorded by URL from the server of 5 ms steps (as `qwen36 baseline record --base-url` does,
    without the machine's speed probe: a synthetic server's timing is its schedule)."""
    root = tmp_path_factory.mktemp("baselines")
    with synthetic(0.005) as server:
        run = run_bench(BenchConfig(workloads=PRESETS[PRESET], base_url=server.url, repeats=3, out_root=root,
                                    label="record", show_progress=False))
    # The tolerances are at least 25% (`--tolerance-floor 0.25`): what a test shows is the gate's path, and the
    # client's own timing on 2 shared cores moves a few ms between runs; the slower server is far outside.
    save_baseline(baseline_from_runs(PROFILE, [run], PRESET, "tests/unit/test_gate_live_by_url.py",
                                     tolerance_floor=0.25), root)
    return root


def live_gate(url: str, baselines: Path, *extra: str, env_key: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "OPENAI_API_KEY"}
    if env_key:
        env["OPENAI_API_KEY"] = env_key
    cmd = [sys.executable, "-m", "pytest", "tests/perf_gates/test_gate_live.py", "-p", "no:cacheprovider", "-q",
           "--server-url", url, "--baseline-profile", PROFILE, "--baselines-dir", str(baselines),
           "--no-machine-speed", *extra]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def failed(done: subprocess.CompletedProcess) -> set[str]:
    return {line.split("[")[1].split("]")[0] for line in done.stdout.splitlines()
            if line.startswith("FAILED") and "[" in line}


@pytest.mark.timing  # a verdict on measured times: alone, after the parallel run
def test_the_same_server_passes_by_url(baselines):
    with synthetic(0.005) as server:
        done = live_gate(server.url, baselines)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "5 passed" in done.stdout, done.stdout[-3000:]


@pytest.mark.timing  # a verdict on measured times: alone, after the parallel run
def test_a_slower_server_fails_on_output_tps(baselines):
    with synthetic(0.0125) as server:  # 2.5x as long between tokens: Output TPS P10 about 60% lower
        done = live_gate(server.url, baselines)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "output_tps_p10" in failed(done) and "ttft_p90" not in failed(done), done.stdout[-3000:]


def test_a_refused_comparison_fails_each_test_with_one_line_naming_the_fix(baselines, tmp_path):
    # The profile of another model: the gate refuses the run (NotComparable), naming the difference and the fix.
    other = yaml.safe_load((baselines / f"{PROFILE}.yaml").read_text())
    other["identity"]["model"] = "another-model"
    (tmp_path / f"{PROFILE}.yaml").write_text(yaml.safe_dump(other, sort_keys=False))
    with synthetic(0.005) as server:
        done = live_gate(server.url, tmp_path)
    assert done.returncode == 1, done.stdout[-3000:]
    assert len(failed(done)) == 5, done.stdout[-3000:]
    refusals = [line for line in done.stdout.splitlines() if "cannot compare" in line and "is not comparable" in line]
    assert len(refusals) >= 5 and "--accept-difference" in refusals[0], done.stdout[-3000:]
    assert "Traceback" not in done.stdout and "NotComparable" not in done.stdout, done.stdout[-3000:]


@pytest.mark.timing  # a verdict on measured times: alone, after the parallel run
def test_a_server_that_wants_a_key_fails_with_the_fix_then_passes_with_the_key(baselines):
    with synthetic(0.005, api_key=KEY) as server:
        without = live_gate(server.url, baselines)
        with_option = live_gate(server.url, baselines, "--api-key", KEY)
        with_env = live_gate(server.url, baselines, env_key=KEY)  # OPENAI_API_KEY is the default
    assert without.returncode == 1 and API_KEY_FIX in without.stdout, without.stdout[-3000:]
    assert "Traceback" not in without.stdout, without.stdout[-3000:]
    assert with_option.returncode == 0, with_option.stdout[-3000:]
    assert with_env.returncode == 0, with_env.stdout[-3000:]
