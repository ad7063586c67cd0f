"""The project's performance history so far, from what the repository already holds: every dispatch table's
committed versions (the GPU tables by date), every recorded profile's versions, and the runs kept under reports/.

Each record says where it came from (`source`, a repository file) and how its commit was found (`commit_source`):
a table's run belongs to the commit that put it into the table; a report's run to the commit that added the
report (the runs name no commit themselves); a profile's recording to the commit it recorded.

The same run can be kept twice: a check added to its table (`--add-run`) is also under reports/, a `qwen36 tune`
report holds the table it wrote, and a file reappears unchanged in later versions. A run is kept once: two
records of one machine kind and day sharing at least half of their values (each value is a sweep median or a
repeat's centre, equal only where the same measurement was copied) are the same run, and the one with more
figures stays (on a tie, the first found: the oldest table version).

Left out, each with its reason in `skipped`: files that do not parse or hold no figure, deliberately slowed runs
(`--inject-delay`), A/B variants that override what the commit serves (`tune step --router/--norm`), and the CPU
gates' evidence files, which keep pair differences between two arms, not either arm's values.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

from harness.errors import HarnessError
from harness.history.commits import added_commits, file_versions, git, show_file
from harness.history.record import Record
from harness.history.sources import Given, payload_kind, records_from_payload
from harness.paths import REPO_ROOT

__all__ = ["backfill_records", "same_run"]

DISPATCH_DIR, BASELINES_DIR, REPORTS_DIR = "fixtures/dispatch", "fixtures/baselines", "reports"
# Variants of a command that measure something other than the commit as it serves (see the module docstring).
VARIANT_FLAGS = {"--inject-delay": "a deliberately slowed run (--inject-delay): not the commit's speed",
                 "--router": "an A/B variant (--router overrides what the commit serves)",
                 "--norm": "an A/B variant (--norm overrides what the commit serves)"}
# The CPU gates' evidence (harness/gates/evidence): per run, pair differences of one arm against another.
PAIR_DIFFERENCES = ("control", "slowed")  # calibrate.py results.jsonl rows
SAME_RUN_SHARE = 0.5

Skipped = list[tuple[str, str]]


def backfill_records(repo: Path = REPO_ROOT) -> tuple[list[Record], Skipped]:
    """(records, skipped): every run the repository holds, each once; skipped: (file, why) for what was left out."""
    repo = Path(repo)
    records: list[Record] = []
    skipped: Skipped = []
    records += _versions(repo, DISPATCH_DIR, ".json", skipped, newest_first=False)
    records += _reports(repo, skipped)
    # A profile's versions newest first: a recording whose point was renamed since keeps today's name.
    records += _versions(repo, BASELINES_DIR, ".yaml", skipped, newest_first=True)
    return _once(records, skipped), skipped


def _paths_ever(repo: Path, folder: str, suffix: str) -> list[str]:
    """Every file of `folder` with `suffix` over the history, deleted ones included."""
    out = git(repo, "log", "--format=", "--name-only", "--", folder) or ""
    return sorted({line.strip() for line in out.splitlines() if line.strip().endswith(suffix)})


def _versions(repo: Path, folder: str, suffix: str, skipped: Skipped, newest_first: bool) -> list[Record]:
    out = []
    for path in _paths_ever(repo, folder, suffix):
        versions = file_versions(path, repo)
        for sha in (versions[::-1] if newest_first else versions):
            text = show_file(sha, path, repo)
            if text is None:
                continue  # the commit that deleted it
            where = f"{path} at {sha[:8]}"
            try:
                raw = yaml.safe_load(text) if suffix == ".yaml" else json.loads(text)
            except (ValueError, yaml.YAMLError) as exc:
                skipped.append((where, f"does not parse: {exc}"))
                continue
            if payload_kind(raw) is None:
                skipped.append((where, "not a dispatch table or recorded profile"))
                continue
            how = (f"commit that changed {path} (version {sha[:8]})" if suffix == ".json" else None)
            given = Given(commit=sha if how else None, repo=repo, commit_source=how)
            try:
                out += [_with_note(r, f"version {sha[:8]} of {path}") for r in records_from_payload(raw, path, given)]
            except HarnessError as exc:
                skipped.append((where, str(exc)))
    return out


def _reports(repo: Path, skipped: Skipped) -> list[Record]:
    added = added_commits(REPORTS_DIR, repo)
    out = []
    for file in sorted((repo / REPORTS_DIR).rglob("*.json*")):
        rel = str(file.relative_to(repo))
        try:
            raw = [json.loads(line) for line in file.read_text().splitlines() if line.strip()] \
                if file.suffix == ".jsonl" else json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            skipped.append((rel, f"does not parse: {exc}"))
            continue
        why = _not_a_history(raw)
        if why:
            skipped.append((rel, why))
            continue
        if payload_kind(raw) is None:
            if file.name in ("check.json", "tune.json", "step.json"):
                skipped.append((rel, "named as a tuner's output but not in its format"))
            continue  # other measurements (the GPU tests' timings, launch counts): no run kind of the history
        sha = added.get(rel)
        given = Given(commit=sha, repo=repo, commit_source=f"commit that added {rel}" if sha else None)
        try:
            records = records_from_payload(raw, rel, given)
        except HarnessError as exc:
            skipped.append((rel, str(exc)))
            continue
        for record in records:
            variant = _variant(record)
            if variant:
                skipped.append((rel, variant))
                continue
            if sha is None:
                record = _with_note(record, f"{rel} is not committed: no commit known")
            out.append(record)
    return out


def _variant(record: Record) -> str | None:
    """Why a run measured something other than the commit as it serves (VARIANT_FLAGS), or None."""
    words = record.command.split()
    for flag, why in VARIANT_FLAGS.items():
        if any(w == flag or w.startswith(flag + "=") for w in words):
            return why
    return VARIANT_FLAGS["--inject-delay"] if any(n.startswith("injected delays") for n in record.notes) else None


def _not_a_history(raw) -> str | None:
    """Why a file under reports/ that looks like a perf run's output holds no figure of one commit, or None."""
    if isinstance(raw, list) and raw and all(isinstance(r, dict) for r in raw):
        if all(k in raw[0] for k in PAIR_DIFFERENCES):
            return ("`qwen36 calibrate` results: per run, pair differences (log ratios) of B and B slowed against A, "
                    "not the arms' values; the arms' run directories are not kept")
        if "checks" in raw[0] and "parent" in raw[0]:
            return ("`qwen36 slower-commit` replays: per run, the change of a scratch slower commit against its parent "
                    "(worse_by), not either side's values, and of commits outside the project's history")
    if isinstance(raw, dict) and "sides" in raw and "verdicts" in raw:
        return "`qwen36 tune --ab`: two checkouts' kernels side by side, judged against each other, no table point"
    return None


def _with_note(record: Record, note: str) -> Record:
    return dataclasses.replace(record, notes=(*record.notes, note))


def _label(record: Record) -> str:
    """Which record: its file (and version), kind, day, run within a table, commit."""
    version = next((n.split()[1] for n in record.notes if n.startswith("version ")), None)
    run = f", {record.notes[0].split(' in ')[0]}" if record.kind == "dispatch-table" and record.notes else ""
    return (f"{record.source}{' at ' + version if version else ''} ({record.kind} of {record.date[:10]}{run}, "
            f"commit {(record.commit or 'unknown')[:8]})")


# Values that repeat between separate runs by their nature (an exact kernel count, a success rate of 1.0, the hit
# rate of a fixed dataset): equal values of these say nothing about two records being one run.
DISCRETE_UNITS = ("kernels", "ratio", "count")


def _fingerprint(record: Record) -> set[tuple[str, float]]:
    """The record's measured values with what they measure (a metric's last part: a renamed point keeps them)."""
    return {(f.metric.rsplit(".", 1)[-1], round(f.value, 6)) for f in record.figures if f.unit not in DISCRETE_UNITS}


def same_run(a: Record, b: Record) -> bool:
    """One measurement kept twice: one machine kind and day, and at least half of the smaller's measured values
    shared (sweep medians and repeat centres are equal only where the same measurement was copied)."""
    if a.machine.kind != b.machine.kind or a.date[:10] != b.date[:10]:
        return False
    if a.figures == b.figures:
        return True
    fa, fb = _fingerprint(a), _fingerprint(b)
    return bool(fa and fb) and len(fa & fb) >= SAME_RUN_SHARE * min(len(fa), len(fb))


def _once(records: list[Record], skipped: Skipped) -> list[Record]:
    kept: list[Record] = []
    for record in records:
        i = next((i for i, k in enumerate(kept) if same_run(k, record)), None)
        if i is None:
            kept.append(record)
            continue
        first = kept[i]
        stays, goes = (record, first) if len(record.figures) > len(first.figures) else (first, record)
        kept[i] = stays
        skipped.append((_label(goes), f"the same run as {_label(stays)} on {stays.machine.kind}: kept there"))
    return kept
