"""The perf gate end to end on the embedded tiny server, against the committed `cpu-tiny` baseline.

Runs alone after the parallel suite (`make test`: marker `timing`). A candidate is the `gate` preset (or the
one workload of it whose metric the test is about: the gate then compares only that point) measured after
its server's warm-ups (harness.gates.regressions.WARMUPS; `make test` runs them during the parallel run, so
here they are usually done already), CI_REPEATS times unless a test says why not, as the baseline's
tolerances were sized for (`recorded.tolerances_sized_for` in fixtures/baselines/cpu-tiny.yaml). The
regressions are the server's own, nothing between it and the client:

| test | what the server does differently | measured | gated metric that must be flagged |
|---|---|---|---|
| control | nothing (the session's server) | both points | none |
| live path by URL | a by-URL profile of the control's runs; the session's server | both points | none (exit 0) |
| slower decode | slow-steps: `--enforce-eager`, no torch.compile, every step op by op | decode-micro | output_tps_p10, weighted_throughput |
| slower prefill | slow-steps: 16-token steps (`--max-num-batched-tokens 16`), eager | official-like | ttft_p90 |

Prefix caching off (`--no-enable-prefix-caching`, cache_hit_rate; the server is eager too, which
harness.gates.regressions explains) is test_gate_no_cache.py: a hit rate is a count the machine's load cannot
change, so it runs in the parallel suite, by URL, and is the live path's failing side as well.

The regressed servers are declared in harness.gates.regressions; under `make test` they start during the
parallel run (harness.suite_session), so this module measures instead of waiting. The measured change of
each is printed beside its verdict (`-s`); docs/perf-gates.md has the table of measured changes. The live
path (`test_gate_live.py`, marker `live`) is proven as a user on another machine runs it: a nested pytest
that knows the server only by its URL (tests/perf_gates/live_gate.py). The tests run in this file's order:
the live path's passing side comes right after the control, so its profile and its candidate are minutes
apart.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.gates.baseline import load_baseline, save_baseline
from harness.gates.gate import GateReport, gate, load_run, report_markdown, write_report
from harness.gates.measure import Warmup, measure, warm
from harness.gates.record import baseline_from_runs, for_url_clients
from harness.gates.regressions import CONTROL_WARMUP, DECODE_WARMUP, PREFILL_WARMUP, SLOW_STEPS
from harness.metrics import Scoring
from harness.placement import client_on
from harness.shared_server import ServerInfo
from tests.perf_gates.live_gate import live_gate

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timing,
              pytest.mark.usefixtures("embedded_server_only")]
SCORING = Scoring.load()
PROFILE = "cpu-tiny"
CI_REPEATS = 3
# The eager server's decode is 30-50% slower, but its repeats spread 10-15% and drift: with 3 repeats the
# one-sided test at 0.05 / 10 checks missed a -34% change once in two tries, so its candidate gets 5.
SLOW_REPEATS = 5


def measure_candidate(server: ServerInfo, root: Path, label: str, warmup: Warmup, repeats: int = CI_REPEATS) -> Path:
    """`warmup` unless the server has had it (the prefix cache's steady state, as when recording), then
    `repeats` of the warm-up's workloads."""
    ran_now = warm(server, warmup, root)
    print(f"\n{label}: warm-up {warmup.name} {'run now' if ran_now else 'done before (make test: parallel run)'}")
    return measure(server, root, label, repeats=repeats, preset=warmup.preset, datasets=warmup.datasets)


def gate_report(run: Path, accept: tuple[str, ...] = ()) -> GateReport:
    report = gate(load_baseline(PROFILE), [load_run(run)], SCORING, accept=accept)
    write_report(report, run)
    print(report_markdown(report))
    return report


def flagged(report: GateReport) -> set[tuple[str, str]]:
    return {(r.point, r.metric) for r in report.regressions}


@pytest.fixture(scope="module")
def control_run(openai_server, tmp_path_factory) -> Path:
    return measure_candidate(openai_server, tmp_path_factory.mktemp("control"), "control", CONTROL_WARMUP)


def test_same_setup_control_passes_against_the_committed_baseline(control_run):
    baseline = load_baseline(PROFILE)
    report = gate_report(control_run)
    assert not report.accepted_differences  # the same model files, dataset and server arguments
    assert {(r.point, r.metric) for r in report.rows} == {
        (p, m) for p in baseline.points for m in baseline.gated_metrics(p)}
    assert report.passed, report_markdown(report)


# The by-URL profile's floor: one server's decode-micro Output TPS P10 went 111 -> 77 -> 102 tok/s within three
# minutes (recording, live gate, a bench run after it; 2026-12-01), a swing its own 3 repeats cannot show.
BY_URL_FLOOR = 0.4
BY_URL_PROFILE = "tiny-by-url"


@pytest.fixture(scope="module")
def by_url_baselines(control_run, tmp_path_factory) -> Path:
    """A baselines directory holding the by-URL profile: the control's runs (measured against the session's
    server just before), as `qwen36 baseline record --base-url URL --tokenizer MODEL_DIR` would write them,
    with the identity fields a by-URL client cannot see left unknown (harness.gates.record.for_url_clients).
    With the tokenizer, the by-URL client builds the control's very prompts (the same dataset hash), so this
    recording costs no measuring of its own and the control's warm-up repeats warmed the server for it."""
    baselines = tmp_path_factory.mktemp("by-url-baselines")
    save_baseline(for_url_clients(baseline_from_runs(
        BY_URL_PROFILE, [control_run], "gate", how="the control's runs (tests/perf_gates/test_gate_tiny_server.py)",
        tolerance_floor=BY_URL_FLOOR, candidate_repeats=CI_REPEATS)), baselines)
    return baselines


def test_live_gate_by_url_passes_on_its_own_profile(openai_server, by_url_baselines, tmp_path):
    """The live path as a user runs it: the live gate by URL, from a pytest that never started a server,
    against a profile recorded on the same server: every gated metric's test passes."""
    with client_on(openai_server.client_cpus):  # the nested pytest inherits this process's cores
        same = live_gate(openai_server.base_url, BY_URL_PROFILE, tmp_path / "same", CI_REPEATS,
                         Path(openai_server.model_dir), baselines=by_url_baselines)
    assert same.process.returncode == 0, same.output()
    assert "5 passed" in same.process.stdout, same.output()


def test_slower_decode_is_caught_on_output_tps_and_weighted_throughput(regressed_servers, tmp_path):
    # decode-micro alone: its 64-token answers are the decode measure. Its ~25-token prompts prefill in two
    # 16-token steps on this server instead of one, 2 of a request's ~66 steps: the decode steps are the change.
    run = measure_candidate(regressed_servers[SLOW_STEPS], tmp_path, "slow-decode", DECODE_WARMUP,
                            repeats=SLOW_REPEATS)
    report = gate_report(run, accept=("server_args",))
    assert {("decode-micro@c2", "output_tps_p10"), ("decode-micro@c2", "weighted_throughput")} <= flagged(report), \
        report_markdown(report)


def test_slower_prefill_is_caught_on_ttft(regressed_servers, tmp_path):
    # official-like alone: the point whose TTFT is a prefill (decode-micro's is mostly the other stream's
    # decode step). Its hit rate rises with small chunks (the recurrent state is cached at more step ends),
    # so the cache cannot be what slows it. One measured repeat after the warm-ups: the change is several
    # times the 20% tolerance (+78% to +128% with 16-token steps alone, compiled, before 2026-12-02), so the
    # baseline's repeats can hold the noise.
    run = measure_candidate(regressed_servers[SLOW_STEPS], tmp_path, "slow-prefill", PREFILL_WARMUP, repeats=1)
    report = gate_report(run, accept=("server_args",))
    assert ("official-like@c1", "ttft_p90") in flagged(report), report_markdown(report)

