"""One history record: the figures one run measured, with where, when, on what and by which command.

A record is data only (JSON, schema `qwen36-history/1`). The store (harness/history/store.py) keeps one file per run;
the publisher (harness/history/site) turns them into a page. Nothing here measures anything.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field

SCHEMA = "qwen36-history/1"
DIRECTIONS = ("lower", "higher")  # which way is better
# A metric name is a dotted path of lowercase words, e.g. `cpu_gate.decode.output_tps_p10`: it becomes a file name
# and an asv benchmark name, so nothing else.
FULL_HASH = re.compile(r"^[0-9a-f]{40}$")  # a commit as records keep it
METRIC_NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_=-]+)+$")


class RecordError(ValueError):
    """A record or figure that cannot be kept as it is; the message names the field and the fix."""


@dataclass(frozen=True)
class Figure:
    metric: str  # e.g. "gpu.decode_step.b1.graph_us"
    value: float
    unit: str  # "us", "ms", "s", "tok/s", "ratio", "kernels", ...
    direction: str  # "lower" or "higher" is better
    low: float | None = None  # the spread or interval around `value`, in its units (None: not measured)
    high: float | None = None
    spread: str = ""  # what low..high is, e.g. "IQR of 20 samples", "min..max of 3 sweeps"
    threshold: float | None = None  # relative change that counts as a regression (the gate's tolerance, if gated)
    gated: bool = True  # whether a gate judges this figure (ungated figures are drawn, not flagged)

    def __post_init__(self) -> None:
        if not METRIC_NAME.match(self.metric):
            raise RecordError(f"metric {self.metric!r}: use dotted lowercase words like 'gpu.decode_step.b1.graph_us'")
        if self.direction not in DIRECTIONS:
            raise RecordError(f"{self.metric}: direction {self.direction!r} must be one of {DIRECTIONS}")
        for name in ("value", "low", "high"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise RecordError(f"{self.metric}: {name}={v!r} is not a finite number")
        if self.threshold is not None and not 0 < self.threshold < 10:
            raise RecordError(f"{self.metric}: threshold {self.threshold!r} must be a relative change in (0, 10)")


@dataclass(frozen=True)
class Machine:
    kind: str  # the line a graph draws per machine: "cpu: AMD EPYC family 25 model 17, avx512f..." or "gpu: NVIDIA H200"
    detail: str = ""  # anything else known (kernel, torch, GPU uuid)


@dataclass(frozen=True)
class Record:
    kind: str  # which harness run wrote it: "tune-check", "tune-table", "tune-step", "paired-gate", "bench", ...
    date: str  # ISO date or date-time of the measurement
    commit: str | None  # full hash of the commit measured (None: not known)
    commit_source: str  # how `commit` was found, e.g. "run manifest", "HEAD at `history add`", "commit that added it"
    machine: Machine
    command: str  # the command that measured it, as a person would type it
    source: str  # the run's file, relative to the repository where it is inside it
    figures: tuple[Figure, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.figures:
            raise RecordError(f"{self.source}: a record needs at least one figure")
        if self.commit is not None and not FULL_HASH.match(self.commit):
            raise RecordError(f"{self.source}: commit {self.commit!r} is not a full 40-hex hash")
        if not re.match(r"^\d{4}-\d{2}-\d{2}", self.date):
            raise RecordError(f"{self.source}: date {self.date!r} must start YYYY-MM-DD")
        seen = set()
        for f in self.figures:
            if f.metric in seen:
                raise RecordError(f"{self.source}: metric {f.metric} appears twice in one run")
            seen.add(f.metric)

    @property
    def identity(self) -> str:
        """Stable across re-adding the same run: the same source, date, commit, machine and figures."""
        blob = json.dumps(self.as_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def file_name(self) -> str:
        commit = (self.commit or "nocommit")[:8]
        return f"{self.date[:10]}-{commit}-{self.kind}-{self.identity}.json"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["figures"] = [asdict(f) for f in self.figures]
        d["notes"] = list(self.notes)
        return {"schema": SCHEMA, **d}

    @classmethod
    def from_dict(cls, raw: dict) -> "Record":
        if raw.get("schema") != SCHEMA:
            raise RecordError(f"schema {raw.get('schema')!r}: this harness reads {SCHEMA}")
        try:
            figures = tuple(Figure(**f) for f in raw["figures"])
            return cls(kind=raw["kind"], date=raw["date"], commit=raw.get("commit"),
                       commit_source=raw.get("commit_source", ""), machine=Machine(**raw["machine"]),
                       command=raw.get("command", ""), source=raw["source"], figures=figures,
                       notes=tuple(raw.get("notes", ())))
        except (KeyError, TypeError) as exc:
            raise RecordError(f"record is missing or mistypes a field ({exc!r})") from exc
