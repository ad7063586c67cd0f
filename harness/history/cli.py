"""`qwen36 history add | backfill | publish | serve`: keep every gated figure over commits, and draw it."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.paths import REPO_ROOT

DEFAULT_SITE = REPO_ROOT / "runs" / "history-site"


def add_parser(sub) -> None:
    h = sub.add_parser("history", help="the performance history: add runs, backfill, publish the page, serve it")
    hs = h.add_subparsers(dest="history_cmd", required=True)
    store_help = "the history store (default: history/records in this checkout)"

    a = hs.add_parser("add", help="add the figures of harness run directories to the store (one record per run)")
    a.add_argument("runs", nargs="+", type=Path, help="run directories (or their JSON) of qwen36 bench, ab, tune "
                   "--check, tune, tune step, CI's paired gates")
    a.add_argument("--store", type=Path, default=None, help=store_help)
    a.add_argument("--commit", default=None, help="the commit the runs measured, where the run does not record it "
                   "(default: HEAD of this checkout, noted as such)")
    a.add_argument("--machine", default=None, help="the machine kind to file them under, where the run does not "
                   "record it, e.g. 'server: BI-V100 TP=4'")
    a.set_defaults(handler=_cmd_add)

    b = hs.add_parser("backfill", help="add what reports/ and the committed tables already hold")
    b.add_argument("--store", type=Path, default=None, help=store_help)
    b.set_defaults(handler=_cmd_backfill)

    p = hs.add_parser("publish", help="build the static page (asv's) from the store")
    p.add_argument("out", type=Path, nargs="?", default=DEFAULT_SITE, help=f"default: {DEFAULT_SITE}")
    p.add_argument("--store", type=Path, default=None, help=store_help)
    p.add_argument("--branch", default=None, help="whose first-parent history to draw (default: the checkout's)")
    p.set_defaults(handler=_cmd_publish)

    s = hs.add_parser("serve", help="serve a published page on 127.0.0.1 for a local look")
    s.add_argument("site", type=Path, nargs="?", default=DEFAULT_SITE, help=f"default: {DEFAULT_SITE}")
    s.add_argument("--port", type=int, default=8765)
    s.set_defaults(handler=_cmd_serve)


def _store(a: argparse.Namespace):
    from harness.history.store import DEFAULT_STORE, HistoryStore

    return HistoryStore(a.store or DEFAULT_STORE)


def _report_written(store, written: list[Path], present: list[Path]) -> None:
    for path in written:
        print(f"added {path}")
    if present:
        print(f"{len(present)} already in {store.folder}")


def _cmd_add(a: argparse.Namespace) -> int:
    from harness.history.commits import at_head_if_unknown
    from harness.history.sources import records_from_run

    store = _store(a)
    records = [r for run in a.runs for r in records_from_run(run, commit=a.commit, machine=a.machine)]
    # --commit names another: a run that records none is filed under HEAD (the record says so)
    _report_written(store, *store.add([at_head_if_unknown(r, "`qwen36 history add`") for r in records]))
    return 0


def _cmd_backfill(a: argparse.Namespace) -> int:
    from harness.history.backfill import backfill_records

    store = _store(a)
    records, skipped = backfill_records()
    _report_written(store, *store.add(records))
    for path, why in skipped:
        print(f"skipped {path}: {why}")
    return 0


def _cmd_publish(a: argparse.Namespace) -> int:
    from harness.history.site import publish

    report = publish(list(_store(a).records()), a.out, branch=a.branch)
    print(report.summary())
    return 0


def _cmd_serve(a: argparse.Namespace) -> int:
    from harness.history.serve import serve_until_interrupted

    serve_until_interrupted(a.site, a.port)
    return 0
