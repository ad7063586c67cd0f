"""From the harness's run outputs to history records: which run a directory or file is, and its reader.

One module per kind of run, each reading the fields its writer writes:
`tune_check` (`qwen36 tune --check`: check.json), `tune_table` (`qwen36 tune`: tune.json; a dispatch table's
recorded timings), `tune_step` (`qwen36 tune step`: step.json), `paired_gate` (CI's paired gates, `qwen36 ab`,
`qwen36 calibrate`: an interleaved run directory), `bench` (`qwen36 bench`, and the live gate's run directory),
`baseline` (a recorded profile, fixtures/baselines/<profile>.yaml);
`gpu_names` (the tuner's point names), `common` (what they share).

    records_from_run(Path("runs/tune/nvidia-h200-check-2026-12-05T101010"), commit="HEAD")

Imports no torch: a history is made where the run's files are, with or without the tuner's dependencies.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from harness.errors import HarnessError
from harness.history.record import Machine, Record
from harness.history.sources import baseline, bench, paired_gate, tune_check, tune_step, tune_table
from harness.history.sources.common import Given, NoFigures, load_json, source_of
from harness.paths import REPO_ROOT

__all__ = ["records_from_run", "records_from_payload", "payload_kind", "Given", "NoFigures", "LOOKED_FOR"]

# (file, the command that writes it): what an unknown directory is searched for, in the error that says so.
LOOKED_FOR = (
    ("check.json", tune_check.WRITER),
    ("tune.json", tune_table.WRITER),
    ("step.json", tune_step.WRITER),
    ("a dispatch table (*.json of schema qwen36-dispatch/2)", tune_table.TABLE_WRITER),
    ("rounds.json", paired_gate.WRITER),
    ("manifest.json and summary.json", bench.WRITER),
    ("a recorded profile (<profile>.yaml)", baseline.WRITER),
)
_BY_PAYLOAD = (  # (kind, claims, reader), the most specific first
    (tune_check.KIND, tune_check.claims, tune_check.from_payload),
    (tune_step.KIND, tune_step.claims, tune_step.from_payload),
    (tune_table.KIND, tune_table.claims_tune, tune_table.from_tune_payload),
    (tune_table.TABLE_KIND, tune_table.claims_table, tune_table.from_table_payload),
    (baseline.KIND, baseline.claims, baseline.from_payload),
)
_NAMED = tune_check.FILES + tune_table.FILES + tune_step.FILES


def payload_kind(raw) -> str | None:
    """Which payload `raw` is ("tune-check", "tune-step", "tune-table", "dispatch-table", "baseline"), or None."""
    return next((kind for kind, claims, _ in _BY_PAYLOAD if claims(raw)), None)


def records_from_payload(raw, source: str, given: Given = Given()) -> list[Record]:
    """The records of a payload already read (JSON, or a profile's YAML; a file's text at some commit, in a
    backfill)."""
    for _, claims, reader in _BY_PAYLOAD:
        if claims(raw):
            return reader(raw, given, source)
    raise HarnessError(f"{source}: not a file the history reads; {_looked_for()}")


def records_from_run(run_dir: Path, *, commit: str | None = None, machine: Machine | str | None = None,
                     repo: Path = REPO_ROOT, side: str | None = None, date: str | None = None) -> list[Record]:
    """The records of one harness run: a run directory or one of its JSON files. `commit` (a revision or full
    hash) and `machine` replace what the run's files say or lack; `side`, the arm of an interleaved run that is
    the commit under test (default: CI's twin, `qwen36 ab`'s B); `date`, for a run whose files carry none."""
    path = Path(run_dir)
    if not path.exists():
        raise HarnessError(f"{path} does not exist; give a run directory or its JSON file")
    given = Given(commit=commit, machine=machine, repo=Path(repo), date=date)
    interleaved = paired_gate.find(path)
    if interleaved is not None and (path.is_dir() or path.name in ("rounds.json", "gate.json")):
        # An arm's own folder (a bench run directory under the run) names the side; gate-<name>/ does not.
        arm = path.name if path != interleaved and (path / "manifest.json").is_file() else None
        return paired_gate.read(interleaved, given, side or arm)
    if path.is_file():
        if path.name in (*bench.FILES, "gate.json") and bench.find(path) is not None:  # gate.json: the live gate's
            return bench.read(path.parent, given)
        return _from_file(path, given)
    named = [path / name for name in _NAMED if (path / name).is_file()]
    if named:
        return [r for file in named for r in _from_file(file, given)]
    if bench.find(path) is not None:
        return bench.read(path, given)
    records = []
    for file in sorted(path.glob("*.json")):  # a table directory (--table-dir), or a check.json kept under a name
        try:
            raw = load_json(file, "the harness")
        except HarnessError:
            continue
        if payload_kind(raw):
            records += records_from_payload(raw, source_of(file, given.repo), given)
    if records:
        return records
    raise HarnessError(f"{path}: not a run the history reads: {_looked_for()}")


def _from_file(path: Path, given: Given) -> list[Record]:
    raw = load_yaml(path) if path.suffix in (".yaml", ".yml") else load_json(path, "the harness")
    return records_from_payload(raw, given.source or source_of(path, given.repo), given)


def load_yaml(path: Path):
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise HarnessError(f"{path}: cannot read it as YAML ({exc}); a profile is what {baseline.WRITER} writes") \
            from exc


def _looked_for() -> str:
    return ("looked for " + "; ".join(f"{name} (written by {writer})" for name, writer in LOOKED_FOR)
            + ". Give the directory one of those commands wrote, or the file itself")
