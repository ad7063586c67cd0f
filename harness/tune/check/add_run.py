"""Adding a run to a dispatch table's timings (harness/tune/table/record.py): from the check that just ran
(`qwen36 tune --check --add-run`), or from a check's report written earlier (`--add-run-from check.json`), so a
run that was reviewed need not be measured again.

A run is added whatever its timing verdict: on the commit that recorded the table, from another machine or
day, it widens each point's limit to how far that point moves between machines. Widening the record is a
decision, reviewed in the table's diff. A check that found wrong outputs, errors or another dispatch adds
nothing: its times describe broken code.
"""
from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

from model.dispatch.table import CHECKOUT_TABLE_DIR, load_dispatch_table, table_file_name

from ..measure.point import Measurement
from ..table.record import append_run, run_meta
from .rule import with_tolerances

__all__ = ["BROKEN", "add_run", "add_reported_run", "report_rows"]

BROKEN = ("DISPATCH", "WRONG", "ERROR", "NOT MEASURED")  # the failure kinds that say broken, not slow


def add_run(path: Path, rows: list[Measurement], meta: dict, failures: list[str]) -> int:
    """Append `rows` (merged sweeps, `extra` holding each sweep's median) as run `meta` minus its id."""
    broken = [f for f in failures if f.split(":")[0] in BROKEN]
    if broken:
        print(f"add a run: not added: the check found {len(broken)} correctness problem(s); fix them first",
              file=sys.stderr)
        return 1
    raw = json.loads(path.read_text())
    timings = raw.get("timings")
    if not timings:
        print(f"add a run: {path} has no timings to add to; record it with `qwen36 tune`", file=sys.stderr)
        return 2
    run_id = 1 + max((r["id"] for r in timings.get("runs", [])), default=-1)
    raw["timings"] = with_tolerances(append_run(timings, rows, {**meta, "id": run_id}))
    path.write_text(json.dumps(raw, indent=2) + "\n")
    load_dispatch_table(path)  # still a table the dispatchers read
    if failures:
        print(f"add a run: the check against the earlier runs failed on {len(failures)} point(s); added anyway, as "
              "asked. Commit this only from the commit that recorded the table.")
    print(f"added run {run_id} to {path}'s timings: commit it")
    return 0


def report_rows(report: dict) -> list[Measurement]:
    """A check report's measured sweeps as rows: its `measured` section, or, in reports written before it had
    one, each verdict's sweeps (the same numbers; the MoE block where it served another path than recorded is
    left out)."""
    if "measured" in report:
        return [Measurement(m["block"], m["key"], m["path"], "ok", launches=m.get("launches"),
                            graph_launches=m.get("graph_launches"), extra={
                                **{f"{mode}_sweeps_us": m.get(f"{mode}_us", []) for mode in ("eager", "graph", "gpu",
                                                                                              "host")},
                                **({"rule": m["rule"]} if m.get("rule") else {})})
                for m in report["measured"]]
    rows: dict[tuple, Measurement] = {}
    for v in report.get("verdicts", []):
        if "measured_sweeps_us" not in v or " (table: " in v["path"]:
            continue
        row = rows.setdefault((v["block"], v["key"], v["path"]),
                              Measurement(v["block"], v["key"], v["path"], "ok", extra={}))
        row.extra[f"{v['mode']}_sweeps_us"] = list(v["measured_sweeps_us"])
    return list(rows.values())


def add_reported_run(report_path: Path, table: Path | None) -> int:
    """`--add-run-from REPORT`: the report's run into `table` (default: the checkout's table of the report's
    device)."""
    try:
        report = json.loads(Path(report_path).read_text())
        machine = report["machine"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"--add-run-from {report_path}: not a `qwen36 tune --check` report.json with its machine ({exc!r})",
              file=sys.stderr)
        return 2
    if report.get("injected"):
        print(f"--add-run-from {report_path}: that check ran with injected delays; its times are not the code's",
              file=sys.stderr)
        return 2
    path = Path(table) if table else CHECKOUT_TABLE_DIR / table_file_name(machine["device"])
    if not path.is_file():
        print(f"--add-run-from: no table {path}; give --table", file=sys.stderr)
        return 2
    date = report.get("date") or dt.datetime.fromtimestamp(Path(report_path).stat().st_mtime, dt.timezone.utc) \
        .date().isoformat()
    meta = run_meta(0, date, report["command"], report["sweeps"], added_from=str(report_path),
                    **({"call_costs": report["call_costs"]} if report.get("call_costs") else {}), **machine)
    return add_run(path, report_rows(report), meta, report.get("failures", []))
