"""Fixtures of the embedded-server perf gate tests (test_gate_tiny_server.py, test_gate_no_cache.py): which
`cpu-tiny` the timing run gates against; the regressed servers are tests/conftest.py's `regressed_servers`."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.gates.baseline import Baseline, load_baseline, save_baseline
from harness.gates.measure import measure, warm
from harness.gates.record import GATE_REPEATS, baseline_from_runs
from harness.gates.regressions import STEADY_PREFIX_CACHE
from harness.machine_speed import machine_kind
from harness.paths import BASELINES_DIR

PROFILE = "cpu-tiny"
# As the committed one was recorded (its `recorded.how`).
RECORD_REPEATS = 5


@pytest.fixture(scope="module")
def embedded_server_only(pytestconfig):
    """For the modules that start, load and regress the embedded server on this machine; against --server-url
    the live gate (test_gate_live.py) is the one that applies."""
    if pytestconfig.getoption("--server-url"):
        pytest.skip("the embedded-server gate tests do not apply to --server-url (test_gate_live.py does)")


@dataclass(frozen=True)
class CpuTiny:
    """The `cpu-tiny` profile the timing run's gates compare with, and where its file is."""
    root: Path

    def load(self) -> Baseline:
        return load_baseline(PROFILE, self.root)


class CommittedBaselineNotApplicable(UserWarning):
    """The committed cpu-tiny is for another kind of machine; the gates ran against one recorded here."""


@pytest.fixture(scope="session")
def cpu_tiny(pytestconfig, openai_server, tmp_path_factory) -> CpuTiny:
    """The committed `cpu-tiny` where this machine is of the kind it was recorded on (its `machine_speed.machine`,
    harness.machine_speed): the gates then see a slower commit. On another kind, no factor makes the committed
    figures comparable (docs/perf-gates.md, "drift"), so `cpu-tiny` is recorded now on the session's server, as
    `qwen36 baseline record` would, and the gates show that they flag the regressions and pass the control
    against it; a warning in the summary says so and how to commit one for this kind."""
    root = Path(pytestconfig.getoption("--baselines-dir") or BASELINES_DIR)
    committed = load_baseline(PROFILE, root)
    recorded_on = (committed.machine_speed or {}).get("machine")
    here = machine_kind()
    if recorded_on is None or recorded_on == here:
        return CpuTiny(root)
    out = tmp_path_factory.mktemp("cpu-tiny-here")
    warm(openai_server, STEADY_PREFIX_CACHE, out)  # the state the committed one was recorded in
    run = measure(openai_server, out, f"baseline-{PROFILE}", repeats=RECORD_REPEATS)
    baseline = baseline_from_runs(PROFILE, [run], "gate", f"tests/perf_gates/conftest.py cpu_tiny ({run})",
                                  tolerance_floor=committed.tolerance_floor, candidate_repeats=GATE_REPEATS)
    save_baseline(baseline, out / "baselines")
    why = (f"the committed {PROFILE} was recorded on {recorded_on!r}, this machine is {here!r}: the timing run's "
           f"gates compare with a {PROFILE} recorded now on the session's server ({out / 'baselines'}), so they "
           "cannot see a slower commit here. If CI now runs on this kind, record the committed one here: "
           f"`qwen36 baseline record --profile {PROFILE} --repeats {RECORD_REPEATS} --preset gate "
           f"--tolerance-floor {committed.tolerance_floor} --update`")
    warnings.warn(CommittedBaselineNotApplicable(why))
    print(f"\n{why}")
    return CpuTiny(out / "baselines")
