"""The history store: a folder of the repository (history/records by default), one JSON file per run.

One file per run keeps concurrent branches from conflicting and makes `git log history/` the store's own log.
Adding the same run twice writes nothing new (the file name carries the record's identity).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

from harness.history.record import Record, RecordError
from harness.paths import REPO_ROOT

DEFAULT_STORE = REPO_ROOT / "history" / "records"


class HistoryStore:
    def __init__(self, folder: Path = DEFAULT_STORE):
        self.folder = Path(folder)

    def add(self, records: Iterable[Record]) -> tuple[list[Path], list[Path]]:
        """Write each record; returns (written, already there)."""
        written, present = [], []
        self.folder.mkdir(parents=True, exist_ok=True)
        for record in records:
            path = self.folder / record.file_name()
            if path.exists():
                present.append(path)
                continue
            path.write_text(json.dumps(record.as_dict(), indent=2, sort_keys=True) + "\n")
            written.append(path)
        return written, present

    def records(self) -> Iterator[Record]:
        for path in sorted(self.folder.glob("*.json")):
            try:
                yield Record.from_dict(json.loads(path.read_text()))
            except (json.JSONDecodeError, RecordError) as exc:
                raise RecordError(f"{path}: {exc}; fix or remove the file") from exc
