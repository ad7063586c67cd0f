"""Perf gates against a live server (the BI-V100 deployment), from any client machine: one test per gated metric.

    pytest tests/perf_gates/test_gate_live.py --server-url http://HOST:PORT --baseline-profile bi-v100-tp4-245k \
        --tokenizer /models/Qwen3.6-35B-A3B
    pytest tests/perf_gates/test_gate_live.py --server-url http://HOST:PORT --baseline-profile cpu-tiny \
        --tokenizer MODEL_DIR --accept-difference server_args,model_files_sha256 --gate-repeats 5
    pytest tests/perf_gates/test_gate_live.py --server-url URL --baseline-profile NAME --api-key KEY  # or $OPENAI_API_KEY

Marked `live` (skipped without --server-url), not `gpu`: the client needs no accelerator, the server has it.
The profile's workload preset (`identity.workload.preset`) is run `--gate-repeats` times (default 3) against
the server; each gated metric is one test, failing on a regression. `--tokenizer` (the served model's
tokenizer.json or its directory) sizes official-like's prompts as the server counts them; the run's dataset
hash then matches a baseline recorded with the same tokenizer. A by-URL client cannot see the server's
arguments or model files: against a profile recorded on the embedded server (cpu-tiny) accept those two
fields, which the report then lists. Against a server on this machine (a loopback URL) the run measures the
machine's speed probe, so a baseline recorded with it is moved to this day (harness.machine.speed); on a
machine busy with other work give --no-machine-speed. The report (gate.md, gate.json) lands in the run
directory. A run the gate refuses (another kind of machine, a setup that differs, a server that wants a key) fails
each test with the one line that says why and what to do, not a traceback.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.bench.run import PRESETS, BenchConfig, on_this_machine, run_bench
from harness.errors import HarnessError
from harness.gates.baseline import load_baseline, load_policy
from harness.gates.gate import GateReport, gate, load_run, report_markdown, write_report
from harness.bench.metrics import Scoring

pytestmark = [pytest.mark.live, pytest.mark.timing]


@pytest.fixture(scope="module")
def live_report(pytestconfig, tmp_path_factory) -> GateReport | str:
    """The gate's report, or why the gate could not compare (a line that names the fix)."""
    url, profile = pytestconfig.getoption("--server-url"), pytestconfig.getoption("--baseline-profile")
    if not url or not profile:
        pytest.skip("live perf gates need --server-url URL and --baseline-profile NAME")
    repeats = pytestconfig.getoption("--gate-repeats")
    if repeats < 1:
        pytest.fail(f"--gate-repeats {repeats}: give at least 1 (3 or more, so the gate knows the server's noise)")
    root = pytestconfig.getoption("--baselines-dir")
    tokenizer = pytestconfig.getoption("--tokenizer")
    try:
        # Names its workload preset, or says how to fix the file.
        baseline = load_baseline(profile, **({"root": Path(root)} if root else {}))
        run = run_bench(BenchConfig(workloads=PRESETS[baseline.workload_preset], base_url=url, repeats=repeats,
                                    api_key=pytestconfig.getoption("--api-key"),
                                    out_root=tmp_path_factory.mktemp("live"), label=f"gate-{profile}",
                                    tokenizer=Path(tokenizer) if tokenizer else None, show_progress=False,
                                    machine_speed=on_this_machine(url)
                                    and not pytestconfig.getoption("--no-machine-speed")))
        report = gate(baseline, [load_run(run)], Scoring.load(), accept=pytestconfig.getoption("--accept-difference"))
    except HarnessError as exc:  # refused or unreachable: the same line in every metric's test
        return f"the live gate against {profile!r} cannot compare: {exc}"
    write_report(report, run)
    print(report_markdown(report))
    return report


@pytest.mark.parametrize("metric", sorted(load_policy()))
def test_live_server_does_not_regress(live_report, metric):
    if isinstance(live_report, str):
        pytest.fail(live_report, pytrace=False)
    rows = [r for r in live_report.rows if r.metric == metric]
    if not rows:
        pytest.skip(f"baseline {live_report.profile!r} has no {metric}")
    bad = [r for r in rows if r.decision.verdict == "regression"]
    assert not bad, report_markdown(live_report)
