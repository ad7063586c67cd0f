"""`qwen36 tune --ab REF_DIR`: A/B this checkout's kernels against a reference's in one run, for a box whose
clocks differ from the recording day's (the pattern of flash-linear-attention's benchmark CI: both revisions
timed on the same machine in the same job, so only their difference is judged).

REF_DIR is the root of a reference checkout: a git worktree (`git worktree add /tmp/ref <commit>`) or a plain
copy on a box without the history. Two worker processes (harness/tune/ab/worker.py) time the routine gate's
points of this device's dispatch table (harness/tune/check/plan.py `routine_points`, exactly the rows `--check`
times, the MoE block and the GDN layer as this checkout serves them under the table): head with this checkout's `model`, ref
with REF_DIR's, both with this checkout's harness and both dispatching by the same table. Each side in turn
warms the device and runs every point once untimed, alone on the machine (compilation and autotuning stay
out of the sweeps). Then each sweep times each point on one side and straight after on the other, the side
that goes first alternating sweep by sweep (ref head, head ref, ...), while the side not asked waits idle.
The rule (harness/tune/ab/rule.py): head is slower at a point when every sweep's head/ref ratio is beyond the
gate's floor for the mode.

Exit 0: pass; 1: head slower at some point, a wrong output or an error on either side, or a worker died;
2: nothing usable to compare (the message says what and the fix); 130: Ctrl-C, 143: SIGTERM (what was
measured is written either way).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from model.dispatch.table import TABLE_ENV, table_file_name

from ..check.device_table import RECORD_COMMAND, TableRefused, dispatching_by, open_device_table
from ..check.plan import routine_plan, routine_points
from ..check.rule import MIN_SWEEPS, point_name
from ..measure import dims as D
from ..measure.progress import Progress
from ..measure.timing import device_identity
from ..table.report import verdict_sections
from .rule import ABVerdict, SideSweeps, judge_ab
from .worker import WorkerDied, WorkerProcess, WorkerRefused

__all__ = ["ABOptions", "HEAD_ROOT", "run_ab", "run_ab_command"]

HEAD_ROOT = Path(__file__).resolve().parents[3]  # this checkout: its harness times both sides
SIDES = ("ref", "head")
_STATUS_ORDER = ("wrong", "error", "missing", "ok")  # a side wrong in any sweep is wrong at that point


@dataclass(frozen=True)
class ABOptions:
    device: str | None = None  # default: cuda when there is one, else cpu
    table: Path | None = None  # default: this device's in the checkout's fixtures/dispatch
    sweeps: int = 3
    reps: int = 20
    warmup: int = 3
    flush_mb: int = 256
    no_graph: bool = False
    hf_config: Path | None = None  # dims from a checkpoint's config.json instead of the table's recorded dims
    tp: int = 4
    report_dir: Path | None = None  # default: runs/tune/<device>-ab-<UTC time>
    progress: bool = True
    command: str = ""


class _Refused(Exception):
    """Nothing usable to compare: the message names the problem and the fix (exit 2)."""


class _Stopped(Exception):
    """Ctrl-C or SIGTERM: stop timing, keep what was measured."""

    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


def run_ab_command(a) -> int:
    """`qwen36 tune --ab REF_DIR` from parsed arguments (harness/tune/args.py)."""
    options = ABOptions(device=a.device, table=a.table, sweeps=a.sweeps, reps=a.reps, warmup=a.warmup,
                        flush_mb=a.flush_mb, no_graph=a.no_graph, hf_config=a.hf_config, tp=a.tp,
                        report_dir=a.report_dir, progress=not a.no_progress,
                        command=shlex.join(getattr(a, "invocation", None) or ["qwen36", *sys.argv[1:]]))
    return run_ab(HEAD_ROOT, a.ab, options)


def _label(point: dict) -> str:
    return f"{point_name(point['block'], point['key'])} {point['path']}"


@dataclass(frozen=True)
class _Setup:
    table: Path
    device: torch.device
    device_name: str
    worker_args: list[str]
    points: list[dict]


def _setup(head_root: Path, ref_root: Path, o: ABOptions) -> _Setup:
    """Everything checked before a worker starts; _Refused names what is wrong and how to fix it."""
    for side, root in (("REF_DIR", ref_root), ("head", head_root)):
        if not Path(root).is_dir():
            raise _Refused(f"{side} {root} does not exist: give the root of a reference checkout, e.g. "
                           "`git worktree add /tmp/ref <commit>` then `--ab /tmp/ref` (or a plain copy of one)")
        if not (Path(root) / "model" / "__init__.py").is_file():
            raise _Refused(f"{side} {root} has no model/__init__.py: give the root of a checkout (the directory "
                           "that holds its `model` package), e.g. a `git worktree add /tmp/ref <commit>`")
    if o.sweeps < MIN_SWEEPS:
        raise _Refused(f"--sweeps {o.sweeps}: the A/B needs at least {MIN_SWEEPS} (head is slower only when "
                       "every sweep is)")
    try:
        t = open_device_table(o.device, o.table)
    except TableRefused as exc:
        raise _Refused(str(exc)) from None
    device, name, table, raw, recorded = t.device, t.name, t.path.resolve(), t.raw, t.recorded
    with dispatching_by(table):  # what this checkout serves under the table: the points `--check` times
        points = routine_points(routine_plan(raw, recorded, device, getattr(torch, raw["dtype"])))
    if not points:
        raise _Refused(f"{table} dispatches nothing and records no MoE block or GDN layer timings: nothing to "
                       f"time; re-record it with `{RECORD_COMMAND}`")
    dims = raw.get("recorded", {}).get("dims", "")
    if D.recorded_dims(dims, o.hf_config, o.tp) is None:
        raise _Refused(f"{table} was recorded at dims {dims!r}; pass --hf-config DIR (and --tp) for those dims")
    args = ["--table", str(table), "--device", str(device),
            "--device-stem", t.stem, "--dtype", raw["dtype"], "--dims", dims,
            "--reps", str(o.reps), "--warmup", str(o.warmup), "--flush-mb", str(o.flush_mb)]
    if o.hf_config is not None:
        args += ["--hf-config", str(Path(o.hf_config).resolve()), "--tp", str(o.tp)]
    if not t.times_graphs(o.no_graph):
        args.append("--no-graph")
    return _Setup(table, device, name, args, points)


def run_ab(head_root: Path, ref_root: Path, options: ABOptions = ABOptions()) -> int:
    """Time the table's routine points with head_root's `model` and ref_root's, interleaved; judge, report.
    The testable core of `qwen36 tune --ab` (which passes this checkout as head)."""
    head_root, ref_root = Path(head_root).resolve(), Path(ref_root).resolve()
    try:
        setup = _setup(head_root, ref_root, options)
    except _Refused as exc:
        print(f"qwen36 tune --ab: {exc}", file=sys.stderr)
        return 2
    report_dir = Path(options.report_dir or Path("runs") / "tune" / (
        f"{table_file_name(setup.device_name).removesuffix('.json')}-ab-"
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H%M%S}"))
    report_dir.mkdir(parents=True, exist_ok=True)
    roots = {"head": head_root, "ref": ref_root}
    results = {side: [[] for _ in setup.points] for side in SIDES}  # side -> point -> each sweep's row
    began = time.monotonic()
    workers: dict[str, WorkerProcess] = {}
    stopped, died, refused = None, None, None
    restore = _on_sigterm()
    try:
        env = {**os.environ, TABLE_ENV: str(setup.table)}
        # The waiting side must be idle: OpenMP threads spin after each parallel region by default, and on a
        # small CPU they take the cores the timed side needs (tiny points then time the scheduler, ~24 ms).
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        for side in SIDES:  # started together: their imports overlap; nothing is timed yet
            workers[side] = WorkerProcess(side, roots[side], HEAD_ROOT, setup.worker_args,
                                          report_dir / f"worker-{side}.log", env)
        for side in SIDES:
            workers[side].ready()
        _interleave(workers, setup.points, options, results)
    except WorkerRefused as exc:
        refused = exc
    except WorkerDied as exc:
        died = str(exc)
    except KeyboardInterrupt:
        stopped = _Stopped(130, "interrupted (Ctrl-C)")
    except _Stopped as exc:
        stopped = exc
    finally:
        restore()
        for w in workers.values():  # after a stop, a death or a refusal nothing more is asked: end each by pid
            if stopped or died or refused:
                w.kill()
            else:
                w.stop()
    if refused:
        advice = (f"{roots[refused.side]} is too old or too new for this harness (its model package lacks a name "
                  "harness/tune imports); A/B against a reference this checkout's harness can time"
                  if refused.kind == "incompatible" else "give the root of a checkout, the directory holding `model`")
        print(f"qwen36 tune --ab: the {refused.side} side cannot be timed: {refused}\n  {advice}", file=sys.stderr)
        return 2
    verdicts = _judge(setup.points, results)
    failures = [v.line() for v in verdicts if v.failed]
    if died:
        failures.append(f"WORKER DIED: {died.splitlines()[0]}")
    if stopped:
        failures.append(f"STOPPED: {stopped}; the verdicts above cover the sweeps before it")
    summary = _write_report(report_dir, setup, options, roots, workers, results, verdicts, failures,
                            time.monotonic() - began)
    for line in summary:
        print(line)
    if died:
        print(f"qwen36 tune --ab: {died}", file=sys.stderr)
        return 1
    if stopped:
        print(f"qwen36 tune --ab: {stopped}; what was measured is in {report_dir / 'ab.md'}", file=sys.stderr)
        return stopped.code
    if failures:
        print(f"FAILED: {len(failures)} problem(s); report {report_dir / 'ab.md'}", file=sys.stderr)
        return 1
    return 0


def _interleave(workers: dict[str, WorkerProcess], points: list[dict], o: ABOptions, results: dict) -> None:
    """The untimed pass on each side alone, then the sweeps, alternating which side goes first."""
    progress = Progress(len(SIDES) * len(points) * (1 + o.sweeps), enabled=o.progress)
    try:
        for side in SIDES:  # one side at a time: autotuning times kernels too, and must not share the device
            workers[side].ask({"op": "warm"}, "warming the device")
            for point in points:
                progress.tick(f"untimed {side}: {_label(point)}")
                workers[side].ask({"op": "measure", "point": point}, f"timing {_label(point)} (untimed pass)")
        for sweep in range(o.sweeps):
            order = SIDES if sweep % 2 == 0 else SIDES[::-1]
            for i, point in enumerate(points):
                for side in order:
                    progress.tick(f"sweep {sweep + 1}/{o.sweeps} {side}: {_label(point)}")
                    answer = workers[side].ask({"op": "measure", "point": point, "count_launches": sweep == 0},
                                               f"timing {_label(point)} (sweep {sweep + 1})")
                    results[side][i].append(answer["rows"][0])
    finally:
        progress.close()


def _side(rows: list[dict]) -> SideSweeps:
    if not rows:
        return SideSweeps("missing", "not measured: the run stopped first")
    worst = min(rows, key=lambda r: _STATUS_ORDER.index(r["status"]) if r["status"] in _STATUS_ORDER else 0)
    ok = [r["status"] == "ok" for r in rows]
    def sweeps(key: str) -> list[float | None]:
        return [r.get(key) if good else None for r, good in zip(rows, ok)]

    def counted(key: str) -> dict | None:
        return next((r[key] for r in rows if r.get(key)), None)

    return SideSweeps(worst["status"], worst["detail"], sweeps("eager_us"), sweeps("graph_us"),
                      next((r["graph_note"] for r in rows if r["graph_us"] is None and r["graph_note"]), ""),
                      sweeps("gpu_us"), counted("launches"), counted("graph_launches"))


def _served(point: dict, rows: list[dict]) -> str:
    r = rows[0] if rows else {}
    return f"layer (rule {r.get('rule')})" if point["path"] == "layer" else r.get("path", "?")


def _path_label(point: dict, head: list[dict], ref: list[dict]) -> str:
    """The table's path; for the staged layer, the rule each side served (both named if they differ)."""
    if point["path"] != "layer":
        return point["path"]
    mine, theirs = _served(point, head), _served(point, ref)
    return theirs if not head else mine if mine == theirs or not ref else f"{mine} (ref: {theirs})"


def _judge(points: list[dict], results: dict) -> list[ABVerdict]:
    verdicts = []
    for i, point in enumerate(points):
        head, ref = results["head"][i], results["ref"][i]
        if not head and not ref:
            continue  # the run stopped before this point's first sweep
        verdicts += judge_ab(point["block"], point["key"], _path_label(point, head, ref), _side(head), _side(ref))
    return verdicts


def _write_report(directory: Path, setup: _Setup, o: ABOptions, roots: dict, workers: dict, results: dict,
                  verdicts: list[ABVerdict], failures: list[str], took: float) -> list[str]:
    identity = device_identity(setup.device)
    sides = {side: {"root": str(roots[side]), "model_file": workers[side].info.get("model_file")
                    if side in workers else None, "pid": workers[side].pid if side in workers else None}
             for side in SIDES}
    # A reference from before dispatch tables serves the block and the layer by its knobs, not by the table.
    notes = [f"{side}'s model has no model.dispatch.table: its MoE block and GDN layer are served by its knobs"
             for side, w in workers.items() if w.info.get("table_followed") is False]
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.status] = counts.get(v.status, 0) + 1
    summary = (f"qwen36 tune --ab on {identity['device']}: head {roots['head']} against ref {roots['ref']}, "
               f"table {setup.table}: {'FAIL' if failures else 'pass'}; "
               f"{', '.join(f'{n} {k}' for k, n in sorted(counts.items())) or 'nothing judged'}; "
               f"{o.sweeps} sweeps in {took:.0f} s")
    payload = {"command": o.command, "device": setup.device_name, "table": str(setup.table), "sides": sides,
               "machine": identity, "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(o).items()},
               "passed": not failures, "seconds": round(took, 1), "failures": failures, "notes": notes,
               "verdicts": [v.as_dict() for v in verdicts],
               "measurements": [{"point": p, "ref": results["ref"][i], "head": results["head"][i]}
                                for i, p in enumerate(setup.points)]}
    (directory / "ab.json").write_text(json.dumps(payload, indent=2) + "\n")
    md = ["# `qwen36 tune --ab`", "", f"- command: `{o.command}`", f"- table: `{setup.table}`",
          *[f"- {side}: `{s['root']}` (model: `{s['model_file']}`)" for side, s in sides.items()],
          f"- machine: {', '.join(f'{k} {v}' for k, v in identity.items())}",
          f"- {o.sweeps} sweeps of {o.reps} reps, the first side alternating; tolerance per point and mode: the "
          f"floor, or the larger spread of either side's sweeps (harness/tune/ab/rule.py); launches exact",
          f"- {summary}", ""]
    md += verdict_sections(failures, notes, [v.line() for v in verdicts])
    (directory / "ab.md").write_text("\n".join(md))
    model_lines = [f"{side} model: {s['model_file'] or '(not started)'}" for side, s in sides.items()]
    return [*(v.line() for v in verdicts), *notes, *model_lines, summary,
            f"report: {directory / 'ab.md'} and ab.json"]


def _on_sigterm():
    """SIGTERM (a time limit) stops the run like Ctrl-C, keeping what was measured; returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(signum, frame):
        raise _Stopped(143, f"stopped by signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    return lambda: signal.signal(signal.SIGTERM, previous)
