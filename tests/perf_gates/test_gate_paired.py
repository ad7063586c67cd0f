"""CI's perf gates: every timing verdict compares two servers measured in this run, on this machine, interleaved.

Why: CI lands on machines of several kinds, about 4x apart in speed, whose speed also drifts by tens of percent
within a run; a recorded baseline cannot tell a slower machine from a slower server (docs/perf-gates.md). So one
interleaved measurement (harness.gates.interleave: `paired` preset, short blocks, rounds alternating in order)
runs four arms, and each test decides on one pair of them (harness.gates.paired):

| test | a (reference) | b (candidate) | must |
|---|---|---|---|
| A/A control | session | twin: the session's server started again, same commit, same arguments | pass every check |
| slower decode | session | twin-slowed: decode steps slower by DECODE_SLOWDOWN (ci_design.py) | flag decode-micro's Output TPS P10 and weighted throughput |
| slower prefill | session | twin-slowed: prefill steps slower by PREFILL_SLOWDOWN (ci_design.py) | flag official-like's TTFT P90 |
| slower commit | reference: the performance reference commit's own server | twin (HEAD's server, started fresh) | pass every check |

The two that must pass are judged by the confirmed rule (harness.gates.confirm): a flagged check is measured again,
another round of the two arms, and fails only if the pooled pairs flag it too; by design a gate's first look alone
may go red on identical servers in up to 5% of runs (its alpha), and two such gates in up to one run in ten. The two that must flag are judged on the first look,
which is what the confirmation starts from; the calibration's runs show every first-look catch at the sizes used
here holding when pooled with a second run (docs/perf-gates.md).

The slowdowns are the servers' own (patches/model_paths/step_slowdown.py, switched per block in the twin's worker), so
one twin is two arms. The tolerances and the pairs measured are fixtures/gates/paired.yaml's, the tolerances sized from
A/A controls on the CI kinds of machine; the slowdowns are sized so that the gate catches them at the widest spread
CI has met (ci_design.py says from what; tests/unit/test_gate_paired.py checks it). docs/perf-gates.md has what the
gate resolves at smaller sizes. Prefix caching off is test_gate_no_cache.py (a count, in the parallel run).

Runs alone after the parallel suite (`make test`: marker `timing`); the servers start and warm during the
parallel run (harness.suite_session).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.bench.run import PRESETS
from harness.history.commits import at_head_if_unknown
from harness.history.sources import NoFigures, records_from_run
from harness.history.store import HistoryStore
from harness.paths import RUNS_DIR
from harness.gates.confirm import ConfirmedVerdict, confirm
from harness.gates.interleave import Arm, InterleavedRun, interleave
from harness.gates.measure import STEADY_PREFIX_CACHE
from harness.gates.measure import warm
from harness.gates.paired import PairedReport, PairedTolerances, paired_gate, report_markdown, write_paired_report
from harness.gates.servers import REFERENCE, TWIN, exclusive
from tests.perf_gates.ci_design import MUST_FLAG, slowed

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timing,
              pytest.mark.usefixtures("embedded_server_only")]

PRESET = "paired"
SESSION, SLOWED = "session", "twin-slowed"


@pytest.fixture(scope="module")
def reference_or_why(request) -> tuple:
    """(the reference's server, None) or (None, why it cannot run here): the other verdicts do not wait on it."""
    try:
        return request.getfixturevalue("reference_server"), None
    except pytest.fail.Exception as exc:
        return None, str(exc)


@dataclass
class Measured:
    run: InterleavedRun
    arms: dict[str, Arm]  # by label: what a confirmation round measures again


@pytest.fixture(scope="module")
def measured(openai_server, twin_server, reference_or_why) -> Measured:
    twin = twin_server
    reference, _ = reference_or_why
    # In this order (reversed every other round): the twin's blocks next to both the session's and the reference's,
    # whose verdicts must pass (the A/A control, the slower commit), so that those pairs are measured closest in time.
    # The session's slowdown is never set: its server runs as its code says (a commit that slows it by default
    # must show against the reference).
    arms = [Arm(SESSION, openai_server), Arm(TWIN, twin, lambda point: ""), Arm(SLOWED, twin, slowed)]
    if reference is not None:
        arms.insert(2, Arm(REFERENCE, reference))
    out = ci_runs_dir()
    for arm in arms:  # the prefix caches' steady state; `make test` warmed them during the parallel run
        with exclusive(arm.server):
            warm(arm.server, STEADY_PREFIX_CACHE, out / "warm")
    run = interleave(arms, PRESETS[PRESET], PairedTolerances.load().pairs, out, "ci", show_progress=True)
    print(f"\ninterleaved run: {run.path} ({run.rounds} rounds, {run.end_reason})")
    yield Measured(run, {arm.label: arm for arm in arms})
    keep_in_history(run.path)


def ci_runs_dir() -> Path:
    """Where the timing run leaves its interleaved run: runs/ci/ in the checkout (kept after the run, unlike pytest's
    temporary folders), or $QWEN36_CI_RUNS."""
    out = Path(os.environ.get("QWEN36_CI_RUNS") or RUNS_DIR / "ci")
    out.mkdir(parents=True, exist_ok=True)
    return out


def keep_in_history(run_path: Path) -> None:
    """The run's figures (HEAD's fresh twin, on this machine's CPU kind) as history records beside it, in
    <run>/history/records/ (docs/history.md): `qwen36 history add <run>` files the same into the repository's store.
    Written after every verdict, passed or not: a history keeps the runs that failed too."""
    try:
        records = [at_head_if_unknown(r, "CI's timing run") for r in records_from_run(run_path)]
    except NoFigures as exc:  # a run that measured nothing: its verdicts have failed already, and say why
        print(f"\nhistory: nothing to record from {run_path}: {exc}")
        return
    written, _ = HistoryStore(run_path / "history" / "records").add(records)
    print(f"\nhistory: {len(written)} record(s) of this run in {run_path / 'history' / 'records'}")


def verdict(measured: Measured, a: str, b: str, name: str, log: list[str], note: str = "") -> PairedReport:
    """The first look: `b` against `a` on the interleaved run, reported and logged."""
    report = paired_gate(measured.run.path, a, b)
    directory = measured.run.path / f"gate-{name}"
    directory.mkdir(exist_ok=True)
    write_paired_report(report, directory)
    log.append(f"## {name}{note}\n\n{report_markdown(report)}")
    return report


def confirmed_verdict(measured: Measured, a: str, b: str, name: str, log: list[str]) -> ConfirmedVerdict:
    """A must-pass verdict: the first look, and where it flagged a regression, its confirmation round."""
    result = confirm(verdict(measured, a, b, name, log), measured.arms, PRESETS[PRESET], PairedTolerances.load().pairs,
                     measured.run.path.parent, show_progress=True)
    if result.pooled is not None:
        directory = measured.run.path / f"gate-{name}-confirmed"
        directory.mkdir(exist_ok=True)
        write_paired_report(result.pooled, directory)
        log.append(f"## {name}: confirmation round\n\n{result.markdown()}")
    return result


def flagged(report: PairedReport) -> set[tuple[str, str]]:
    return {(r.point, r.metric) for r in report.regressions}


def test_aa_control_two_starts_of_the_same_server_pass_every_check(measured, paired_reports):
    result = confirmed_verdict(measured, SESSION, TWIN, "aa-control", paired_reports)
    assert result.passed, result.markdown()


def test_slower_decode_is_caught_on_output_tps_and_weighted_throughput(measured, paired_reports):
    report = verdict(measured, SESSION, SLOWED, "slower-decode", paired_reports)
    assert MUST_FLAG["slower-decode"] <= flagged(report), report_markdown(report)


def test_slower_prefill_is_caught_on_ttft(measured, paired_reports):
    report = verdict(measured, SESSION, SLOWED, "slower-prefill", paired_reports)
    assert MUST_FLAG["slower-prefill"] <= flagged(report), report_markdown(report)


def test_head_is_not_slower_than_the_performance_reference_commit(measured, reference_or_why, paired_reports):
    """HEAD's fresh server against the reference's fresh server: both started in the timing run's set and warmed
    the same way (harness.suite_session), so the verdict is about the commit. The session's server has served the
    whole parallel run by then; against the reference it measures the session's state as well (a run of the
    gate-power work read the session server at 116 tok/s and its fresh twin at 128, +10% against a 9.5% tolerance),
    so that comparison is printed for the record, not gated (docs/perf-gates.md, "What CI proves")."""
    _, why = reference_or_why
    if why is not None:
        pytest.fail(why, pytrace=False)
    verdict(measured, REFERENCE, SESSION, "commit-against-session", paired_reports, " (for the record, not gated)")
    result = confirmed_verdict(measured, REFERENCE, TWIN, "slower-commit", paired_reports)
    assert result.passed, result.markdown()
