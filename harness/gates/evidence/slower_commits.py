"""Real slower commits, kept as patch fixtures and replayed through `qwen36 ab` against their parent.

The step slowdown (patches/model_paths/step_slowdown.py) tells the gates' designers what they can see; these tell a
user what the gate does with the kind of change people make. Each fixture (fixtures/gates/slower-commits/) is a
patch a person could plausibly commit, with the cost it adds and the gated checks it should move (its "own"
metrics). A replay:

1. checks HEAD out into a scratch worktree, applies the patch there and commits it (the slower commit; its
   parent is HEAD);
2. points that worktree's performance reference at the parent (fixtures/gates/reference.yaml, uncommitted);
3. runs that worktree's `qwen36 ab` N times, each starting both servers again (the parent's and the slower
   commit's), as a user would;
4. records how each run ended (replays.jsonl) and judges every run from its run directories with paired.yaml's
   tolerances (summary.md, summary.json): first look, confirmation, and whether the commit was caught on its own
   checks. `summary` judges them again after the tolerances move.

    qwen36 slower-commit list
    qwen36 slower-commit replay per-token-stream --times 5 --out runs/slower-commits/per-token-stream
    qwen36 slower-commit summary per-token-stream runs/slower-commits/per-token-stream   # judged again, no measuring

The worktree goes when the replay ends, Ctrl-C included; the run directories stay. `check_applies` is what the
unit tests run on every fixture, so a fixture that no longer applies to HEAD fails on a laptop, not in a replay.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from harness.bench.metrics import REGISTRY
from harness.errors import HarnessError
from harness.gates.paired import PairedTolerances, paired_gate
from harness.paths import FIXTURES, REFERENCE_FILE, REPO_ROOT

SLOWER_COMMITS_DIR = FIXTURES / "gates" / "slower-commits"
INDEX = SLOWER_COMMITS_DIR / "index.yaml"
# The exit status `qwen36 ab` gives a confirmed regression (harness.gates.commands.EXIT_REGRESSION).
AB_REGRESSION = 1


@dataclass(frozen=True)
class SlowerCommit:
    name: str
    patch: Path
    message: str  # the commit message it is committed with
    cost: str  # what it adds, in words
    own: tuple[tuple[str, str], ...]  # (point, metric): the checks it should move


def load_slower_commits(index: Path = INDEX) -> dict[str, SlowerCommit]:
    try:
        raw = yaml.safe_load(Path(index).read_text()) or {}
        return {name: SlowerCommit(name, Path(index).parent / entry["patch"], entry["message"], entry["cost"],
                                   tuple(tuple(check.split(":")) for check in entry["own"]))
                for name, entry in raw["commits"].items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise HarnessError(f"slower-commit index {index}: {exc!r}; it needs commits.<name>: {{patch, message, cost, "
                           "own: [point:metric, ...]}}") from exc


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise HarnessError(f"`git {' '.join(args)}` failed in {cwd}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def check_applies(commit: SlowerCommit, root: Path = REPO_ROOT) -> str | None:
    """None when the fixture applies to `root`'s working tree, else git's reason."""
    done = subprocess.run(["git", "apply", "--check", str(commit.patch)], cwd=root, capture_output=True, text=True,
                          timeout=60)
    return None if done.returncode == 0 else (done.stderr.strip() or f"git apply exited {done.returncode}")


@contextlib.contextmanager
def scratch_commit(commit: SlowerCommit, root: Path = REPO_ROOT) -> Iterator[tuple[Path, str]]:
    """(worktree, parent): HEAD of `root` checked out in a scratch worktree with the fixture committed on top, its
    performance reference pointed at the parent. The worktree is removed on the way out."""
    parent = _git("rev-parse", "HEAD", cwd=root)
    with tempfile.TemporaryDirectory(prefix=f"qwen36-{commit.name}-") as scratch:
        worktree = Path(scratch) / "worktree"
        _git("worktree", "add", "--detach", str(worktree), parent, cwd=root)
        try:
            _git("apply", "--index", str(commit.patch), cwd=worktree)
            _git("-c", "user.name=qwen36 slower-commit", "-c", "user.email=slower-commit@localhost", "commit",
                 "--no-verify", "-q", "-m", commit.message, cwd=worktree)
            reference = worktree / REFERENCE_FILE.relative_to(REPO_ROOT)
            reference.write_text(f"# {commit.name}: the slower commit's parent\ncommit: {parent}\n"
                                 f"moved: '{time.strftime('%Y-%m-%d')}'\nnote: replay of {commit.name}\n")
            yield worktree, parent
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=root, capture_output=True,
                           timeout=120)
            subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True, timeout=60)


def verdicts(ab_out: Path, tolerances: PairedTolerances | None = None) -> dict:
    """One `qwen36 ab` run's verdict per check, judged again from its run directories with `tolerances` (default:
    fixtures/gates/paired.yaml's): the first look's and, where the first look flags it, the pooled one's (the first
    look and its confirmation round; harness.gates.confirm). A check flagged by the first look whose point the run
    did not measure again cannot be confirmed here and says so."""
    firsts = sorted(p for p in Path(ab_out).glob("*-ab") if (p / "rounds.json").exists())
    if not firsts:
        raise HarnessError(f"{ab_out} holds no `qwen36 ab` run (no *-ab/rounds.json)")
    first_path = firsts[-1]
    confirmations = sorted(Path(ab_out).glob("*-confirm-B-against-A"))
    first = paired_gate(first_path, "A", "B", tolerances)
    flagged = {(r.point, r.metric) for r in first.regressions}
    pooled = None
    if flagged and confirmations:
        # As harness.gates.confirm pools them: every check, a point measured once keeping its first-look pairs.
        pooled = paired_gate([first_path, confirmations[-1]], "A", "B", tolerances, family_alpha=first.family_alpha)
    checks = {}
    for row in first.rows:
        key = (row.point, row.metric)
        again = None
        if pooled is not None and key in flagged:
            again = next((r for r in pooled.rows if (r.point, r.metric) == key), None)
        d = row.decision
        checks[f"{row.point}:{row.metric}"] = {
            "first": row.verdict, "underpowered": bool(d and d.underpowered),
            "worse_by": d.worse_by if d else None, "p_worse": d.p_worse if d else None,
            "tolerance": row.tolerance.value, "spread": row.spread,
            "pooled": again.verdict if again else ("not measured again" if key in flagged else None),
            "pooled_worse_by": again.decision.worse_by if again and again.decision else None,
            "caught": bool(again and again.verdict == "regression")}
    return {"run": str(first_path), "checks": checks}


def caught_on_own(record: dict, commit: SlowerCommit) -> bool:
    return any(record["checks"].get(f"{p}:{m}", {}).get("caught") for p, m in commit.own)


def replay(commit: SlowerCommit, times: int, out: Path, root: Path = REPO_ROOT) -> Path:
    """Run the fixture's `qwen36 ab` against its parent `times` times; returns `out` (replays.jsonl, summary.md)."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with scratch_commit(commit, root) as (worktree, parent):
        for i in range(times):
            ab_out = out / f"run{i}"
            print(f"{commit.name}: run {i + 1} of {times} (qwen36 ab, both servers started again)", file=sys.stderr)
            began = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "harness.cli", "ab", "--out", str(ab_out)], cwd=worktree,
                                  env={**os.environ, "PYTHONPATH": str(worktree)})
            record = {"commit": commit.name, "parent": parent, "run": i, "exit": done.returncode,
                      "seconds": round(time.monotonic() - began)}
            with open(out / "replays.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            if done.returncode not in (0, AB_REGRESSION):
                break  # a refused or failed measurement: the records so far stay, the rest would fail alike
    summarise(commit, out)
    return out


def summarise(commit: SlowerCommit, out: Path, tolerances: PairedTolerances | None = None) -> list[dict]:
    """Every replay in `out` judged again with `tolerances` (default: paired.yaml's), into summary.md and
    summary.json; how each run ended (its exit status, seconds) stays as replays.jsonl recorded it."""
    records = []
    for record in load_replays(out):
        record = {k: v for k, v in record.items() if k in ("commit", "parent", "run", "exit", "seconds")}
        try:
            judged = verdicts(Path(out) / f"run{record['run']}", tolerances)
            record |= {"run_dir": judged["run"], "checks": judged["checks"]}
            record["caught_on_own"] = caught_on_own(record, commit)
        except HarnessError as exc:
            record["error"] = str(exc)
        records.append(record)
    (Path(out) / "summary.md").write_text(summary_markdown(commit, records))
    (Path(out) / "summary.json").write_text(json.dumps(records, indent=2) + "\n")
    return records


def load_replays(out: Path) -> list[dict]:
    path = Path(out) / "replays.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _change(worse_by: float | None, metric: str) -> str:
    if worse_by is None:
        return ""
    return f"{math.expm1(-worse_by if REGISTRY[metric].direction == 'higher' else worse_by):+.1%}"


def summary_markdown(commit: SlowerCommit, records: list[dict]) -> str:
    own = [f"{p}:{m}" for p, m in commit.own]
    caught = sum(1 for r in records if r.get("caught_on_own"))
    lines = [f"# Slower commit `{commit.name}` against its parent, {len(records)} `qwen36 ab` runs", "",
             f"{commit.cost}", "", f"Own checks: {', '.join(own)}. **Caught on its own checks in {caught} of "
             f"{len(records)} runs.**", "",
             "Exit: `qwen36 ab`'s status when it ran (1: a confirmed regression), with the tolerances of that day; "
             "the verdicts are judged again with fixtures/gates/paired.yaml's.", "",
             "| run | exit | seconds | check | change, first look | spread of pair ratios | tolerance | first look | "
             "change, pooled | confirmed |", "|---:|---:|---:|---|---:|---:|---:|---|---:|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['run']} | {r['exit']} | {r['seconds']} | {r['error']} | | | | | | |")
            continue
        for check, c in r["checks"].items():
            if check.endswith(("success_rate", "cache_hit_rate")) and c["first"] == "pass":
                continue
            metric = check.split(":")[1]
            first = c["first"] + (" (underpowered)" if c["underpowered"] and c["first"] == "pass" else "")
            mark = "**" if check in own else ""
            lines.append(f"| {r['run']} | {r['exit']} | {r['seconds']} | {mark}{check}{mark} | "
                         f"{_change(c['worse_by'], metric)} | "
                         f"{'' if c['spread'] is None else format(c['spread'], '.3f')} | {c['tolerance']:g} | {first} | "
                         f"{_change(c['pooled_worse_by'], metric)} | "
                         f"{'yes' if c['caught'] else ''} |")
    return "\n".join(lines) + "\n"
