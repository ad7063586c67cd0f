"""What every run kind's reader shares: what the caller knows beyond the run's files (`Given`), metric names made
safe, spreads, dates, and the errors that say which file was wrong and why."""
from __future__ import annotations

import datetime as dt
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.history.commits import commit_of
from harness.history.record import FULL_HASH, Figure, Machine, Record, RecordError
from harness.paths import REPO_ROOT

__all__ = ["Given", "NoFigures", "segment", "metric", "point_segments", "min_max", "relative", "centre",
           "source_of", "load_json", "date_in_path", "run_date", "dirty_note",
           "build_record"]

_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})")


class NoFigures(HarnessError):
    """A run of a known kind that holds nothing to plot (a config sweep, a run that measured nothing): the message
    says why."""


@dataclass(frozen=True)
class Given:
    """What the caller says about a run that its files may not: the commit measured (a rev or a full hash), the
    machine, the date; `source`, where the run's text came from when it is not a file on disk (a git version)."""
    commit: str | None = None
    machine: Machine | str | None = None
    repo: Path = REPO_ROOT
    date: str | None = None
    source: str | None = None
    commit_source: str | None = None

    def commit_and_how(self, found: str | None, how: str) -> tuple[str | None, str]:
        """The caller's commit where given (resolved by git), else what the run's files said (`found`, `how`)."""
        if self.commit is None:
            if found and FULL_HASH.match(found):
                return found, how
            return None, how if how.startswith("not ") else f"not known: {how} holds no full hash ({found!r})"
        sha = commit_of(self.commit, self.repo)
        if sha is None and not FULL_HASH.match(self.commit):
            raise HarnessError(f"commit {self.commit!r}: git does not know it in {self.repo}; give a full 40-hex hash "
                               "or a revision of that repository")
        return sha or self.commit, self.commit_source or f"given ({self.commit})"

    def machine_or(self, found: Machine) -> Machine:
        if self.machine is None:
            return found
        return self.machine if isinstance(self.machine, Machine) else Machine(str(self.machine), found.detail)


def segment(text: object) -> str:
    """One dotted part of a metric name: lowercase, characters other than a-z 0-9 _ = - made `_`."""
    s = re.sub(r"[^a-z0-9_=-]+", "_", str(text).strip().lower()).strip("_")
    return s or "none"


def metric(*parts: object) -> str:
    """A metric name from its parts; the first part starts with a letter or digit (record.METRIC_NAME)."""
    first, *rest = [segment(p) for p in parts]
    return ".".join([re.sub(r"[^a-z0-9_]", "_", first), *rest])


def point_segments(point: str) -> tuple[str, ...]:
    """A bench point's name as metric parts: "decode-micro@c2" -> ("decode-micro", "c2"),
    "matrix@c2-i128-o64" -> ("matrix", "c2-i128-o64")."""
    dataset, _, rest = point.partition("@")
    return (dataset, rest) if rest else (dataset,)


def min_max(values: list[float]) -> tuple[float | None, float | None]:
    """(low, high) of two or more values; (None, None) for fewer (no spread measured)."""
    return (min(values), max(values)) if len(values) >= 2 else (None, None)


def relative(threshold: float | None) -> float | None:
    """A relative tolerance as a Figure threshold, or None where it is none or out of Figure's range."""
    return threshold if threshold is not None and 0 < threshold < 10 else None


def centre(values: list[float], scale: str) -> float:
    """The gates' centre of repeated values (harness.gates.decision): the geometric mean for a relative tolerance,
    the mean for an absolute one (and where a value is <= 0, which a ratio cannot take)."""
    if scale == "relative" and all(v > 0 for v in values):
        return math.exp(statistics.fmean(math.log(v) for v in values))
    return statistics.fmean(values)


def source_of(path: Path, repo: Path) -> str:
    """`path` relative to the repository where it is inside it, else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path(repo).resolve()))
    except ValueError:
        return str(path)


def load_json(path: Path, writer: str):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise HarnessError(f"{path}: cannot read it as JSON ({exc}); it should be what {writer} writes") from exc


def date_in_path(path: str | Path) -> str | None:
    """The last YYYY-MM-DD in a path (reports/<topic>-YYYY-MM-DD/...), or None."""
    found = _DATE.findall(str(path))
    return found[-1] if found else None


def run_date(found: str | None, given: Given, where: str | Path) -> tuple[str, list[str]]:
    """(the run's date, notes): the given date, else the run's own, else the date in its path, else its file's
    modification day, each but the run's own said in a note."""
    if given.date:
        return given.date, []
    if found and _DATE.match(str(found)):
        return str(found), []
    from_path = date_in_path(where)
    if from_path:
        return from_path, [f"date from the path {where} (the run's file has none)"]
    try:
        day = dt.datetime.fromtimestamp(Path(where).stat().st_mtime, dt.timezone.utc).date().isoformat()
    except OSError:
        raise HarnessError(f"{where}: no date in the run's file or its path; pass the date the run was made") from None
    return day, [f"date from the file's modification time (the run's file has none): {where}"]


def dirty_note(harness: dict) -> list[str]:
    """A run manifest's `harness` ({commit, dirty}): a note where the tree had uncommitted changes."""
    return ["measured on a tree with uncommitted changes (manifest harness.dirty)"] if harness.get("dirty") else []


def build_record(*, kind: str, date: str, commit: str | None, commit_source: str, machine: Machine, command: str,
                 source: str, figures: list[Figure], notes: list[str] | tuple[str, ...] = ()) -> Record:
    if not figures:
        raise NoFigures(f"{source}: a {kind} run with no figure to keep")
    try:
        return Record(kind=kind, date=date, commit=commit, commit_source=commit_source, machine=machine,
                      command=command or "", source=source, figures=tuple(figures), notes=tuple(notes))
    except RecordError as exc:
        raise HarnessError(f"{source}: {exc}") from exc
