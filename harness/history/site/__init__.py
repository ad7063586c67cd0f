"""`qwen36 history publish`: the history store as a static site, drawn and judged by asv's publisher.

asv (airspeed velocity) is the anchor: its page (a plot per benchmark over commits, one line per machine, a list
view, a regressions list and feed) and its step detection with per-benchmark thresholds. It reads results files
and a git repository and never runs a benchmark, so the records are written as asv results (asv_results.py),
asv publishes them, and this package then restores the directions (directions.py), vendors the page's scripts
from npm (vendor.py) and adds a page per commit with the runs behind each point (run_pages.py).
"""
from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError
from harness.history.commits import git
from harness.history.record import Record
from harness.history.site.asv_results import BANDS, Placed, machine_slug, write_results
from harness.history.site.catalog import Metric, metric_catalog
from harness.history.site.directions import asv_threshold, restore
from harness.history.site.run_pages import write_run_pages
from harness.history.site.vendor import node_modules, remote_loads, vendor_page
from harness.paths import REPO_ROOT

PROJECT = "qwen36-serving"


@dataclass(frozen=True)
class Regression:
    metric: str
    machine: str  # the asv machine name (machine_slug of the record's kind)
    commit: str  # the first commit after the step (full hash)
    before: float  # as measured: the value before the step and the best after it
    after: float


@dataclass
class PublishReport:
    out_dir: Path
    records: int = 0
    drawn: int = 0
    metrics: int = 0
    machines: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    regressions: list[Regression] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"history page: {self.out_dir}/index.html ({self.drawn} of {self.records} runs drawn, "
                 f"{self.metrics} metrics, machines: {', '.join(self.machines) or 'none'})",
                 f"regressions marked: {len(self.regressions)}"]
        lines += [f"  {r.metric} on {r.machine} at {r.commit[:8]}: {r.before:.4g} -> {r.after:.4g}"
                  for r in self.regressions]
        if self.left_out:
            lines.append(f"left out ({len(self.left_out)}):")
            lines += [f"  {why}" for why in self.left_out]
        lines.append("it loads its data over HTTP: `qwen36 history serve` (or any static server), not file://")
        return "\n".join(lines)


def _git(repo: Path, *args: str) -> str:
    out = git(repo, *args)
    if out is None:
        raise HarnessError(f"git {' '.join(args)} in {repo} failed; the history page needs the repository whose "
                           "commits the records name")
    return out


def _place(records: list[Record], repo: Path, branch: str) -> tuple[list[Placed], list[str]]:
    """The records whose commit is on `branch`, with the commit's date; the rest, each with why."""
    on_branch = set(_git(repo, "rev-list", "--first-parent", branch).split())
    placed, left_out = [], []
    wanted = sorted({r.commit for r in records if r.commit in on_branch})
    dates = {}
    if wanted:
        for line in _git(repo, "log", "--no-walk=unsorted", "--format=%H %ct", *wanted).splitlines():
            sha, ct = line.split()
            dates[sha] = int(ct) * 1000
    for r in records:
        if r.commit is None:
            left_out.append(f"{r.source}: no commit recorded ({r.commit_source or 'unknown'})")
        elif r.commit not in on_branch:
            left_out.append(f"{r.source}: commit {r.commit[:12]} is not on {branch}'s first-parent history")
        else:
            placed.append(Placed(r, dates[r.commit]))
    return placed, left_out


def _asv_config(work: Path, repo: Path, branch: str, out_dir: Path, catalog: dict[str, Metric]) -> Path:
    # asv matches every regex against every line it judges, and Python's regex cache holds 512: one regex per
    # threshold (names joined), one for the ungated and one for the spread bands keep a publish of ~500 metrics
    # in seconds (one regex per metric took minutes).
    by_threshold: dict[float, list[str]] = {}
    for name, m in catalog.items():
        if m.gated:
            by_threshold.setdefault(asv_threshold(m), []).append(re.escape(name))
    thresholds = {_entries(names): t for t, names in by_threshold.items()}
    ungated = [re.escape(name) for name, m in catalog.items() if not m.gated]
    off = {rf".*\(({'|'.join(b for b in BANDS if b != 'value')})\)(@.*)?$": None}  # spread lines: drawn, not judged
    if ungated:
        off[_entries(ungated)] = None  # drawn, never marked
    conf = {"version": 1, "project": PROJECT, "project_url": "#/", "repo": str(repo), "dvcs": "git",
            "branches": [branch], "results_dir": str(work / "results"), "html_dir": str(out_dir),
            "show_commit_url": "runs/", "hash_length": 8, "regressions_thresholds": thresholds,
            "regressions_first_commits": off, "environment_type": "virtualenv"}
    path = work / "asv.conf.json"
    path.write_text(json.dumps(conf, indent=1))
    return path


def _entries(escaped_names: list[str]) -> str:
    """The regex asv matches a judged line's name against: `name(value)`, and `@branch` after it."""
    return rf"^({'|'.join(escaped_names)})\(value\)(@.*)?$"


def publish(records: list[Record], out_dir: Path, repo: Path = REPO_ROOT, branch: str | None = None) -> PublishReport:
    try:
        from asv.commands.publish import Publish
        from asv.config import Config
        from asv.plugins.regressions import Regressions
        from asv.repo import get_repo
    except ImportError as exc:
        raise HarnessError("the history page is published by asv: install it with `pip install -e '.[history]'` "
                           "(`make venv` does)") from exc
    out_dir, repo = Path(out_dir).resolve(), Path(repo).resolve()
    branch = branch or _git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    if branch == "HEAD":
        raise HarnessError(f"{repo} is on a detached HEAD: name the branch whose history to draw (--branch main)")
    report = PublishReport(out_dir, records=len(records))
    catalog = metric_catalog(records)
    placed, report.left_out = _place(records, repo, branch)
    modules = node_modules()  # before asv clears out_dir: a failing npm leaves the last page standing
    with tempfile.TemporaryDirectory(prefix="qwen36-history-") as tmp:
        work = Path(tmp)
        report.left_out += write_results(work / "results", placed, catalog)
        conf = Config.load(str(_asv_config(work, repo, branch, out_dir, catalog)))
        Publish.run(conf, pull=False)
        restore(out_dir, catalog)
        regressions = json.loads((out_dir / "regressions.json").read_text())["regressions"]
        _rewrite_feed(conf, regressions, Regressions, get_repo)
    vendor_page(out_dir, modules)
    for page in out_dir.glob("*.html"):
        if remote_loads(page.read_text()):
            raise HarnessError(f"{page} still loads {remote_loads(page.read_text())} from the network")
    write_run_pages(out_dir, [p.record for p in placed], repo)
    report.drawn = len(placed)
    report.metrics = len(catalog)
    report.machines = sorted({machine_slug(p.record.machine.kind) for p in placed})
    report.regressions = _regressions(regressions, out_dir)
    return report


def _rewrite_feed(conf, regressions: list, regressions_cls, get_repo) -> None:
    """asv wrote regressions.xml from the reciprocal values; write it again from the restored ones."""
    from asv.benchmarks import Benchmarks
    from asv.results import iter_results

    repo = get_repo(conf)
    hashes = {r.commit_hash for r in iter_results(conf.results_dir)}
    revisions = repo.get_revisions(hashes)
    regressions_cls._save_feed(conf, Benchmarks.load(conf), regressions, revisions,
                               {r: h for h, r in revisions.items()})


def _regressions(entries: list, out_dir: Path) -> list[Regression]:
    index = json.loads((out_dir / "index.json").read_text())
    to_hash = index["revision_to_hash"]
    found = []
    for name, graph_path, params, _idx, _last, _best, jumps in entries:
        machine = params.get("machine") or re.search(r"machine-([^/]+)", graph_path).group(1)
        for _rev_a, rev_b, before, after in jumps:
            found.append(Regression(name.split("(")[0], machine, to_hash[str(rev_b)], before, after))
    return found
