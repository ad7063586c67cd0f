"""CI's paired perf gates, `qwen36 ab` and `qwen36 calibrate`'s runs: an interleaved run directory
(harness/gates/interleave.py: rounds.json and one bench run directory per arm; the verdicts, gate.json, by
harness/gates/paired.py in the run or in gate-<name>/ under it).

The figures are ONE arm's: the commit under test. In CI's run that is the twin (HEAD's server started fresh, the
candidate of the slower-commit verdict against the reference); in `qwen36 ab` and a calibration run, B. Per gated
check (fixtures/gates/paired.yaml: point and metric), the arm's value in each interleaved block, centred as the
gate centres them (geometric mean where the tolerance is relative, mean where absolute), with their min..max.
A figure's threshold is the check's relative tolerance. The value is the arm's level on that run's machine: a
paired verdict compares it with the other arm of the same run, a history with other runs of the same kind of
machine.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from harness.errors import HarnessError
from harness.history.commits import NOT_HEAD, show_file
from harness.history.machines import cpu_machine, machine_from_kind_text, server_machine
from harness.history.record import FULL_HASH, Figure, Machine, Record
from harness.history.sources.common import (
    Given, NoFigures, build_record, centre, dirty_note, metric, min_max, point_segments, relative, run_date,
    source_of,
)

__all__ = ["FILES", "WRITER", "find", "read", "machine_of_run"]

FILES = ("rounds.json",)
WRITER = ("CI's paired gates (tests/perf_gates/test_gate_paired.py), `qwen36 ab` and `qwen36 calibrate` "
          "(harness/gates/interleave.py)")
SESSION = "session"  # tests/perf_gates/test_gate_paired.py: the session's server, the reference side of A/A
CALIBRATION_SLOWED = "B-slowed"
REFERENCE_YAML = "fixtures/gates/reference.yaml"  # harness/paths.py REFERENCE_FILE, as a path at a commit  # harness/gates/evidence/calibrate.py SLOWED


def find(path: Path) -> Path | None:
    """The interleaved run `path` is, or holds a verdict of (gate.json in gate-<name>/ or confirmed/)."""
    path = Path(path)
    folder = path.parent if path.is_file() else path
    for candidate in (folder, folder.parent):
        if (candidate / "rounds.json").is_file():
            return candidate
    return None


def _kinds(arms: dict) -> tuple[str, str, str | None]:
    """(record kind, command, default side) from the arms' labels."""
    from harness.gates.servers import TWIN  # its module imports the serving stack: only when a run is read

    if SESSION in arms:
        return "paired-gate", "make test (tests/perf_gates/test_gate_paired.py)", TWIN if TWIN in arms else None
    if CALIBRATION_SLOWED in arms:
        return "calibrate", "qwen36 calibrate", "B"
    if "B" in arms:
        return "ab", "qwen36 ab", "B"
    return "interleaved", "harness.gates.interleave", None


def _rounds(run_dir: Path) -> dict:
    try:
        meta = json.loads((run_dir / "rounds.json").read_text())
    except (OSError, ValueError) as exc:
        meta = {"error": repr(exc)}
    if not isinstance(meta, dict) or not isinstance(meta.get("arms"), dict) or not isinstance(meta.get("points"), list):
        raise HarnessError(f"{run_dir}/rounds.json: not an interleaved run's (it needs `arms` and `points`: "
                           f"{str(meta)[:200]}); {WRITER} write it")
    return meta


def machine_of_run(run_dir: Path, manifest: dict, base_url: str = "") -> tuple[Machine, list[str]]:
    """The machine an interleaved run was measured on: a server elsewhere by its URL (`qwen36 ab --b URL`); else
    the kind `qwen36 calibrate` keeps beside its runs (calibrate.MACHINE_FILE, in the run's folder or the
    calibration's), else the speed probe's kind in the arm's manifest, else this machine's CPU (said in a note:
    the run recorded none)."""
    from harness.bench.run import on_this_machine
    from harness.gates.evidence.calibrate import MACHINE_FILE

    if base_url and not on_this_machine(base_url):
        return server_machine(base_url), []
    for folder in (run_dir, run_dir.parent, run_dir.parent.parent):
        if (folder / MACHINE_FILE).is_file():
            return machine_from_kind_text((folder / MACHINE_FILE).read_text()), []
    probe = (manifest.get("machine_speed") or {}).get("machine")
    if probe:
        return machine_from_kind_text(probe), []
    here = cpu_machine()
    return here, [f"machine: the run records none; this machine's CPU at `history add` ({here.kind})"]


def _verdicts(run_dir: Path) -> list[str]:
    """One line per paired verdict written in the run (gate.json at its root, in gate-<name>/ and confirmed/)."""
    lines = []
    for path in sorted([run_dir / "gate.json", *run_dir.glob("*/gate.json")]):
        try:
            report = json.loads(path.read_text())
            labels = report["labels"]
            lines.append(f"verdict {path.parent.name if path.parent != run_dir else 'ab'}: {labels['b']} against "
                         f"{labels['a']}: {'pass' if report['passed'] else 'FAIL'}")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return lines


def _reference_commit(side: str, harness_commit: str | None, repo: Path) -> tuple[str | None, str]:
    """CI's `reference` arm is the server of the performance reference commit that the checkout's
    fixtures/gates/reference.yaml named when the run was made; `qwen36 ab`'s A may be any server."""
    if side == "reference" and harness_commit:
        text = show_file(harness_commit, REFERENCE_YAML, repo)
        named = (yaml.safe_load(text) or {}).get("commit") if text else None
        if isinstance(named, str) and FULL_HASH.match(named):
            return named, f"the performance reference that {REFERENCE_YAML} named at {harness_commit[:12]}"
    return None, (f"{NOT_HEAD} arm {side!r} is the reference side (another commit's or another machine's "
                  "server), whose commit the run does not name; --commit names it")


def read(path: Path, given: Given, side: str | None = None) -> list[Record]:
    from harness.bench.metrics import REGISTRY
    from harness.gates.gate import load_run
    from harness.gates.paired import PairedTolerances

    run_dir = find(path)
    if run_dir is None:
        raise HarnessError(f"{path}: not an interleaved run (no rounds.json in it or its parent); {WRITER} write one")
    meta = _rounds(run_dir)
    kind, command, default = _kinds(meta["arms"])
    side = side or default
    if side is None or side not in meta["arms"]:
        raise HarnessError(f"{run_dir}: which arm is the commit under test? arms {', '.join(meta['arms'])}; "
                           f"{'side ' + repr(side) + ' is not one; ' if side else ''}pass side=<arm>")
    arm = load_run(run_dir / side)
    tolerances = PairedTolerances.load()
    figures = []
    for point in meta["points"]:
        repeats = arm.points.get(point) or []
        for name in tolerances.checks(point):
            values = [float(r[name]) for r in repeats if isinstance(r.get(name), (int, float))
                      and not isinstance(r.get(name), bool)]
            if not values:
                continue
            tol = tolerances.tolerance(point, name)
            geometric = tol.scale == "relative" and all(v > 0 for v in values)
            low, high = min_max(values)
            spec = REGISTRY[name]
            figures.append(Figure(
                metric("cpu_gate", *point_segments(point), name), centre(values, tol.scale), spec.unit,
                spec.direction, low, high,
                f"min..max of {len(values)} interleaved blocks; value: their {'geometric ' if geometric else ''}mean",
                relative(tol.value) if tol.scale == "relative" else None, True))
    if not figures:
        raise NoFigures(f"{run_dir / side}: no gated value in the arm's blocks ({meta.get('end_reason')}, "
                        f"{meta.get('rounds')} rounds)")
    manifest = arm.manifest
    harness = manifest.get("harness") or {}
    if side in ("reference", "A"):  # the reference side: its manifest has the harness's commit, not the server's
        found, how = _reference_commit(side, harness.get("commit"), given.repo)
    else:
        found, how = harness.get("commit"), "run manifest (harness.commit of the arm's run directory)"
    commit, how = given.commit_and_how(found, how)
    machine, notes = machine_of_run(run_dir, manifest, str(meta["arms"][side]))
    date, date_notes = run_date(manifest.get("created"), given, run_dir / side / "manifest.json")
    notes = [f"arm {side!r} of {', '.join(meta['arms'])}; {meta.get('rounds')} rounds, {meta.get('end_reason')}",
             *dirty_note(harness),
             *_verdicts(run_dir), *notes, *date_notes]
    return [build_record(kind=kind, date=date, commit=commit, commit_source=how, machine=given.machine_or(machine),
                         command=command, source=given.source or source_of(run_dir / side, given.repo),
                         figures=figures, notes=notes)]
