"""One page per commit, `runs/<hash>/index.html`: every run recorded at that commit, with its figures, machine,
command and a copy of its source file. asv's commit links (`show_commit_url` = `runs/`) land here, so a point of a
plot leads to the runs behind it.
"""
from __future__ import annotations

import html
import shutil
from collections import defaultdict
from pathlib import Path

from harness.history.record import Record

MAX_COPY_BYTES = 5 * 1024 * 1024  # a source larger than this is named, not copied


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.4g}"


def write_run_pages(html_dir: Path, records: list[Record], repo: Path) -> int:
    by_commit: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        if r.commit:
            by_commit[r.commit].append(r)
    for commit, runs in by_commit.items():
        folder = html_dir / "runs" / commit
        folder.mkdir(parents=True, exist_ok=True)
        parts = [f"<!doctype html><meta charset='utf-8'><title>runs at {commit[:8]}</title>",
                 "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
                 "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child{text-align:left}"
                 "</style>", f"<h1>Runs recorded at commit <code>{commit}</code></h1>",
                 "<p><a href='../../index.html'>back to the plots</a></p>"]
        for r in sorted(runs, key=lambda r: (r.date, r.kind)):
            source = _copy_source(repo, r, folder)
            parts += [f"<h2 id='{r.identity}'>{html.escape(r.kind)} on {html.escape(r.machine.kind)}, {html.escape(r.date)}</h2>",
                      "<ul>", f"<li>command: <code>{html.escape(r.command or 'not recorded')}</code></li>",
                      f"<li>source: {source}</li>",
                      f"<li>commit: {html.escape(r.commit_source)}</li>",
                      *([f"<li>machine: {html.escape(r.machine.detail)}</li>"] if r.machine.detail else []),
                      *(f"<li>{html.escape(n)}</li>" for n in r.notes), "</ul>",
                      "<table><tr><th>metric</th><th>value</th><th>low</th><th>high</th><th>unit</th>"
                      "<th>better</th><th>spread</th><th>threshold</th><th>gated</th></tr>"]
            for f in r.figures:
                threshold = "" if f.threshold is None else f"{f.threshold:.1%}"
                parts.append(f"<tr><td>{html.escape(f.metric)}</td><td>{_fmt(f.value)}</td><td>{_fmt(f.low)}</td>"
                             f"<td>{_fmt(f.high)}</td><td>{html.escape(f.unit)}</td><td>{f.direction}</td>"
                             f"<td>{html.escape(f.spread)}</td><td>{threshold}</td><td>{'yes' if f.gated else 'no'}"
                             "</td></tr>")
            parts.append("</table>")
        (folder / "index.html").write_text("\n".join(parts) + "\n")
    return len(by_commit)


def _copy_source(repo: Path, record: Record, folder: Path) -> str:
    path = Path(record.source)
    path = path if path.is_absolute() else repo / path
    label = html.escape(record.source)
    if not path.is_file():
        return f"<code>{label}</code> (not present in this checkout)"
    if path.stat().st_size > MAX_COPY_BYTES:
        return f"<code>{label}</code> ({path.stat().st_size // 1024} KiB, not copied)"
    target = folder / record.identity / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, target)
    return f"<a href='{record.identity}/{html.escape(path.name)}'>{label}</a>"
