"""`qwen36 tune --check` (the routine GPU perf gate) and `qwen36 tune --check-stale` (the full check): re-time
what the device's dispatch table dispatches, the way `qwen36 tune` timed it (same reps, warm-up calls, L2 flush,
eager and graph replay, outputs checked against float64), and judge it against the table's timings
(harness/tune/check/rule.py). Exit 0: pass; 1: a point slower beyond its tolerance, a stale choice, a wrong output,
or the dispatcher serving another path than the table names; 2: nothing to check against (no table for this
device, or one without timings), with the command that records one."""
from __future__ import annotations

import datetime as dt
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from model.gdn import select_decode_layer_path, select_rule_path
from model.moe import MoEConfig, select_block_path, select_expert_path

from ..blocks.attention_and_norm import sweep_add_rms_norm, sweep_attention_layer
from ..blocks.gdn import sweep_gdn
from ..blocks.gdn_layer import time_gdn_layer
from ..blocks.gdn_stages import sweep_gated_norm, sweep_gdn_conv
from ..blocks.moe import sweep_moe_block, sweep_moe_experts
from ..measure import dims as D
from ..measure.call_costs import call_costs, merged_costs
from ..measure.ceilings import ceilings_for
from ..measure.point import Measurement, Settings
from ..measure.progress import Progress
from ..measure.prune import Pruner
from ..measure.timing import L2Flusher, device_identity, triton_version, warm_device
from ..step.point import StepPoints, step_model_config
from ..table.block_rows import COMPOSED, STAGED, block_choice, fused_layer_paths
from ..table.record import RecordedPoint, run_meta
from ..table.report import cost_section, verdict_sections
from ..table.sweeps import merge_sweeps
from .add_run import add_run
from .device_table import RECORD_COMMAND, TableRefused, dispatching_by, open_device_table
from .inject import InjectError, injected_delays, parse_injections
from .plan import (
    PATH_BLOCKS, STAGE_DEFAULTS, CheckPlan, layer_paths_to_time, plan_check, ranking_block, routine_plan,
)
from .rule import (
    MIN_SWEEPS, STALE_MARGINS, LaunchVerdict, PointVerdict, StaleVerdict, judge_launches, judge_point, judge_stale,
)

__all__ = ["run_check"]

# The dispatch blocks that choose a whole block's path (harness/tune/table/block_rows.py).
WHOLE_BLOCKS = ("moe_block", "gdn_layer_decode")

def _refuse(message: str) -> int:
    print(f"qwen36 tune --check: {message}", file=sys.stderr)
    return 2


def run_check(a) -> int:
    try:
        t = open_device_table(a.device, a.table)
    except TableRefused as exc:
        return _refuse(str(exc))
    device, path, raw, recorded = t.device, t.path, t.raw, t.recorded
    if not recorded:
        return _refuse(f"{path} has no timings (schema {raw.get('schema')}: the ranges alone); re-record it on "
                       f"this device with `{RECORD_COMMAND}`, which keeps every path's times per sweep")
    rec_meta = raw.get("recorded", {})
    dims = D.recorded_dims(rec_meta.get("dims", ""), a.hf_config, a.tp)
    if dims is None:
        return _refuse(f"{path} was recorded at dims {rec_meta.get('dims')!r}; pass --hf-config DIR (and --tp) "
                       "for those dims")
    if a.sweeps < MIN_SWEEPS:
        return _refuse(f"--sweeps {a.sweeps}: the gate needs at least {MIN_SWEEPS} (a point is slower only when "
                       "every sweep is)")
    try:
        delays = parse_injections(a.inject_delay or [])
    except InjectError as exc:
        return _refuse(str(exc))
    with dispatching_by(path):  # the dispatchers follow the table under test, whatever the environment
        dtype = getattr(torch, raw["dtype"])
        reps, warmup = int(rec_meta.get("reps", a.reps)), int(rec_meta.get("warmup", a.warmup))
        flush_mb = int(rec_meta.get("flush_mb", a.flush_mb))
        s = Settings(device, dtype, reps, warmup, t.times_graphs(a.no_graph), L2Flusher(device, flush_mb * 2**20))
        full = bool(a.check_stale)
        # routine: the block as served there (a fused block path, or composed with the served experts), the
        # same plan `--ab` compares
        plan = plan_check(raw, recorded, full) if full else routine_plan(raw, recorded, device, dtype)
        began = time.monotonic()
        with injected_delays(delays) as injected:
            rows, costs = _measure(plan, dims, s, a, ceilings_for(t.stem, None, None))
        merged = merge_sweeps(rows)
        verdicts, failures, notes = _judge(plan, merged, recorded, raw, device, dtype, full, s.graphs)
        cost = merged_costs(costs)
        took = time.monotonic() - began
        report_dir = a.report_dir or Path("runs") / "tune" / (
            f"{t.stem}-{'stale' if full else 'check'}-"
            f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H%M%S}")
        command = shlex.join(getattr(a, "invocation", None) or ["qwen36", *sys.argv[1:]])
        identity = device_identity(device)
        summary = _write_report(Path(report_dir), command, path, identity, verdicts, failures, notes + injected,
                                took, a, merged, injected, cost)
        for line in summary:
            print(line)
        if a.add_run:
            today = dt.datetime.now(dt.timezone.utc).date().isoformat()
            return add_run(Path(path), merged, run_meta(0, today, command, a.sweeps, torch=torch.__version__,
                                                        triton=triton_version(), call_costs=cost, **identity),
                           failures)
        if failures:
            print(f"FAILED: {len(failures)} problem(s); report {report_dir}/check.md", file=sys.stderr)
            return 1
        return 0


def _measure(plan: CheckPlan, dims: D.TuneDims, s: Settings, a, ceilings) -> tuple[list[Measurement], list[dict]]:
    """Every sweep's rows, and each sweep's call costs (measure/call_costs.py). The first sweep also counts each
    point's launches (exact: once is enough, and the profiler stays out of the other sweeps' times)."""
    rows: list[Measurement] = []
    costs: list[dict] = []
    progress = Progress(a.sweeps * plan.points(), enabled=not a.no_progress)
    step = StepPoints(step_model_config(dims.name, a.hf_config, a.tp), s) if plan.step_batches else None
    try:
        warm_device(s.device)
        for sweep in range(a.sweeps):  # whole passes: a point's sweeps are minutes apart, not back to back
            swept = replace(s, count_launches=sweep == 0)
            costs.append(call_costs(s.device, s.dtype, s.flusher, s.reps))
            _sweep(plan, dims, swept, a, ceilings, progress.tick, rows, step)
    finally:
        progress.close()
    return rows, costs


def _sweep(plan: CheckPlan, dims: D.TuneDims, s: Settings, a, ceilings, tick, rows: list[Measurement],
           step: StepPoints | None) -> None:
    never = Pruner(float("inf"), True)
    gdn_paths_at = lambda block, key: getattr(plan, block).get(key)  # noqa: E731  (the (block, key) sweeps' filter)
    if plan.gdn_prefill or plan.gdn_decode:
        sweep_gdn(dims.gdn, sorted(plan.gdn_prefill), sorted(plan.gdn_decode), s, ceilings, never, tick, rows,
                  paths_at=gdn_paths_at)
    if plan.gdn_conv:
        sweep_gdn_conv(dims.gdn, sorted(plan.gdn_conv), s, ceilings, tick, rows, gdn_paths_at)
    if plan.gdn_gated_norm:
        sweep_gated_norm(dims.gdn, sorted(plan.gdn_gated_norm), s, ceilings, tick, rows, gdn_paths_at)
    if plan.attention_layer_decode:
        sweep_attention_layer(dims.attention, sorted(plan.attention_layer_decode), D.attention_context(dims), s,
                              ceilings, tick, rows, gdn_paths_at)
    if plan.add_rms_norm:
        sweep_add_rms_norm(dims.attention.hidden_size, dims.attention.eps, sorted(plan.add_rms_norm), s, ceilings,
                           tick, rows, gdn_paths_at)
    if plan.layer_points:
        time_gdn_layer(dims.gdn, s, lambda b, t: select_rule_path(t, b, s.device, s.dtype), tick, plan.layer_points,
                       rows, stages=layer_paths_to_time(plan, fused_layer_paths(), bool(a.check_stale)))
    if plan.moe_experts:
        sweep_moe_experts(dims.moe, sorted(plan.moe_experts), s, ceilings, never, tick, None, rows,
                          paths_at=plan.paths_at("moe_experts"))
    if plan.moe_block:
        sweep_moe_block(dims.moe, sorted(plan.moe_block), s, ceilings, never, tick, None, rows,
                        paths_at=plan.paths_at("moe_block"))
    if step is not None:
        step.sweep(plan.step_batches, tick, rows, s)


# The dispatchers called as (key, device, dtype); the routed experts and the delta rule take other arguments.
SELECTORS = {**STAGE_DEFAULTS, "moe_block": select_block_path, "gdn_layer_decode": select_decode_layer_path}


def _served(block: str, key: int, device, dtype) -> str:
    if block == "moe_experts":
        return select_expert_path(key, MoEConfig(), device, dtype)
    if block in SELECTORS:
        return SELECTORS[block](key, device, dtype)
    return select_rule_path(1, key, device, dtype) if block == "gdn_decode" else select_rule_path(key, 1, device, dtype)


def _table_choice(plan: CheckPlan, block: str, key: int) -> str:
    """What the table serves at a point of a whole-block dispatch; a table without the block serves the default."""
    return plan.dispatched.get((block, key), COMPOSED if block == "moe_block" else STAGED)


def _row_choice(plan: CheckPlan, block: str, key: int, path: str) -> str | None:
    """The choice a `moe_block` or `gdn_layer_decode` row stands for, or None. Of the composed block's rows (one
    per expert path) only the one with the experts the table serves there stands for `composed`."""
    choice = block_choice(block, block, path)
    if choice == COMPOSED and path != plan.dispatched.get(("moe_experts", key)):
        return None
    return choice


def _judge(plan: CheckPlan, merged: list[Measurement], recorded: dict[tuple, RecordedPoint], raw: dict, device,
           dtype, full: bool, graphs: bool):
    verdicts: list[PointVerdict | StaleVerdict] = []
    failures: list[str] = []
    notes: list[str] = [] if graphs else ["graph replay not timed (--no-graph, no CUDA graphs here, or none "
                                          "recorded): graph times are not judged"]
    modes = ("eager", "graph", "gpu") if graphs else ("eager", "gpu")
    gated_modes = _gated_modes(raw, graphs)
    if "eager" not in gated_modes:
        notes.append("eager times not gated: the table's runs come from one machine, and an eager time is mostly "
                     "the host's, which differs between machines by more than the record can show; add a run from "
                     "another machine (`--check --add-run`)")
    for (block, key), path in sorted(plan.dispatched.items()):
        served = _served(block, key, device, dtype)
        if served != path:
            failures.append(f"DISPATCH: {block} at {key}: the table names {path} but the dispatcher serves {served} "
                            f"({path} cannot run here, or is not registered)")
    for r in merged:
        if r.status != "ok":
            failures.append(f"{r.status.upper()}: {r.block} {r.key} {r.path}: {r.detail}")
    # Points the table dispatches, the block and the layer: each against its own record, eager and graph.
    table_moe = {key: p for (b, key), p in plan.dispatched.items() if b == "moe_experts"}
    for r in merged:
        if r.status != "ok":
            continue
        if r.block in PATH_BLOCKS and plan.dispatched.get((r.block, r.key)) != r.path:
            continue  # the full check's other paths: judged for staleness below
        if r.block in WHOLE_BLOCKS and block_choice(r.block, r.block, r.path) not in (
                None, _table_choice(plan, r.block, r.key)):
            continue  # a whole-block path the table does not serve there: judged for staleness below
        record_path = r.path
        if r.block == "moe_block" and block_choice(r.block, r.block, r.path) == COMPOSED:
            record_path = table_moe.get(r.key, r.path)  # the composed block as it was recorded serving
            if full and r.path != record_path:
                continue
        rp = recorded.get((r.block, r.key, record_path))
        _judge_launches(r, rp, verdicts, failures, notes)
        for mode in modes:
            measured = r.extra.get(f"{mode}_sweeps_us", [])
            values = rp.values(mode) if rp else []
            if not measured and values:
                failures.append(f"NOT MEASURED: {r.block} {r.key} {r.path} ({mode}) was recorded but did not run "
                                f"now: {r.graph_note or r.detail}")
                continue
            if not measured:
                continue
            # The GPU's own time where the record has it; a record from before it was timed, the replay.
            gated = mode in gated_modes and (mode != "graph" or not (rp and rp.values("gpu")))
            v = judge_point(r.block, r.key, r.path if r.path == record_path else f"{r.path} (table: {record_path})",
                            mode, values, measured, gated=gated)
            verdicts.append(v)
            if v.failed:
                failures.append(v.line())
            elif v.status == "unrecorded" and rp is None and mode == "eager":  # once per point the table lacks
                failures.append(f"UNRECORDED: {v.line()}; re-record the table with `{RECORD_COMMAND}`")
            elif v.status == "faster" and v.gated:
                notes.append(f"{v.line()}: re-record to tighten the gate")
    if full:
        _judge_stale(plan, merged, raw, verdicts, failures)
    return verdicts, failures, notes


def _gated_modes(raw: dict, graphs: bool) -> set[str]:
    """The modes a verdict fails on. The GPU's own time always (where a point has no record of it: the graph
    replay, in a table ranked by graph). Eager where the table ranks by it (the BI-V100), or where its runs come
    from two machines or more: an eager time is mostly the host's launch cost, and how far that moves between
    machines is known only from runs on several (H200s of one model differed by 1.75x at the median point,
    2026-12-04)."""
    gated = {"gpu"}
    if graphs and str(raw.get("ranked_by", "")).startswith("graph"):
        gated.add("graph")
    machines = {r.get("gpu_uuid") or r.get("host") for r in raw.get("timings", {}).get("runs", [])}
    if "graph" not in gated or len(machines) >= 2:
        gated.add("eager")
    return gated


def _judge_launches(r: Measurement, rp: RecordedPoint | None, verdicts, failures, notes) -> None:
    """Exact launch counts of one call and one replay against the latest run that counted them."""
    for mode, counts in (("eager", r.launches), ("graph", r.graph_launches)):
        if counts is None:
            continue
        v = judge_launches(r.block, r.key, r.path, mode, (rp.launches.get(mode) if rp else None), counts)
        verdicts.append(v)
        if v.failed:
            failures.append(v.line())
        elif v.status == "fewer":
            notes.append(f"{v.line()}: re-record to hold the new count")


def _judge_stale(plan: CheckPlan, merged, raw, verdicts, failures) -> None:
    graph_first = str(raw.get("ranked_by", "")).startswith("graph")
    by_point: dict[tuple[str, int], dict[str, Measurement]] = {}
    for r in merged:
        if r.status == "ok":
            by_point.setdefault((r.block, r.key), {})[r.path] = r
    points = {**plan.by_default, **plan.dispatched}  # a stage block the table lacks: its default is the choice
    for r in merged:  # whole-block points a table recorded before the block was dispatched serves by default
        if r.block in WHOLE_BLOCKS and block_choice(r.block, r.block, r.path):
            points.setdefault((r.block, r.key), _table_choice(plan, r.block, r.key))
    for (block, key), chosen in sorted(points.items()):
        source = ranking_block(block, key, plan)
        here = by_point.get((source, key), {})
        if block in WHOLE_BLOCKS:  # rows by the choice they stand for
            here = {c: r for p, r in here.items() if (c := _row_choice(plan, block, key, p))}
        else:  # the routed experts ranked at the block's points: the composed block's rows only
            here = {p: r for p, r in here.items() if block_choice(block, source, p)}
        if chosen not in here:
            continue  # already a failure above (wrong, error, or not served)
        mode = "graph" if graph_first and here[chosen].extra.get("graph_sweeps_us") else "eager"
        times = {p: r.extra.get(f"{mode}_sweeps_us", []) for p, r in here.items()}
        # Paths timed side by side in each sweep: the floor alone, machine-to-machine spread does not enter.
        v = judge_stale(block, key, mode, chosen, {p: t for p, t in times.items() if t}, STALE_MARGINS[mode])
        verdicts.append(v)
        if v.stale:
            failures.append(f"{v.line()}; re-record the table with `{RECORD_COMMAND}`")


def _write_report(directory: Path, command: str, table_path, identity: dict, verdicts, failures, notes,
                  took: float, a, merged: list[Measurement], injected: list[str], costs: dict | None) -> list[str]:
    device = identity["device"]
    directory.mkdir(parents=True, exist_ok=True)
    kind = "full check (stale dispatch)" if a.check_stale else "routine check"
    counts: dict[str, int] = {}
    for v in verdicts:
        status = ("stale" if v.stale else "fresh") if isinstance(v, StaleVerdict) else \
            f"launches {v.status}" if isinstance(v, LaunchVerdict) else \
            (v.status if v.gated else f"{v.status} (not gated)")
        counts[status] = counts.get(status, 0) + 1
    summary = [f"qwen36 tune {kind} on {device} against {table_path}: "
               f"{'FAIL' if failures else 'pass'}; {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}; "
               f"{a.sweeps} sweeps in {took:.0f} s"]
    payload = {"command": command, "device": device, "table": str(table_path), "kind": kind, "machine": identity,
               "date": dt.datetime.now(dt.timezone.utc).date().isoformat(), "torch": torch.__version__,
               "injected": injected, "passed": not failures, "seconds": round(took, 1), "sweeps": a.sweeps,
               "failures": failures, "notes": notes, "call_costs": costs,
               "verdicts": [v.as_dict() for v in verdicts],
               # What --add-run-from adds to the table: each correct row's sweep medians.
               "measured": [{"block": r.block, "key": r.key, "path": r.path, "rule": r.extra.get("rule"),
                             **{f"{mode}_us": r.extra.get(f"{mode}_sweeps_us", [])
                                for mode in ("eager", "graph", "gpu", "host")},
                             "launches": r.launches, "graph_launches": r.graph_launches}
                            for r in merged if r.status == "ok"]}
    (directory / "check.json").write_text(json.dumps(payload, indent=2) + "\n")
    md = [f"# `qwen36 tune` {kind} on {device}", "", f"- command: `{command}`", f"- table: `{table_path}`",
          f"- machine: {', '.join(f'{k} {v}' for k, v in identity.items())}",
          f"- {summary[0]}", ""]
    md += cost_section(merged, costs)
    md += verdict_sections(failures, notes, [v.line() for v in verdicts])
    (directory / "check.md").write_text("\n".join(md))
    return [*failures, *notes, *summary, f"report: {directory / 'check.md'} and check.json"]
