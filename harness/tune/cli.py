"""Running `qwen36 tune` (also `python -m harness.tune`): sweep, check, time, write the table and the report."""
from __future__ import annotations

import datetime as dt
import shlex
import signal
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

from model.dispatch.table import CHECKOUT_TABLE_DIR, DispatchTable, parse_dispatch_table, table_file_name
from model.gdn import select_conv_path, select_gated_norm_path, select_rule_path

from .blocks.attention_and_norm import sweep_add_rms_norm, sweep_attention_layer, unavailable_step_block_paths
from .blocks.gdn import sweep_gdn, unavailable_rule_paths
from .blocks.gdn_layer import LAYER_POINTS, time_gdn_layer
from .blocks.gdn_stages import conv_points, norm_points, sweep_gated_norm, sweep_gdn_conv, unavailable_stage_paths
from .blocks.moe import (
    graphed_block_tokens, sweep_graphed_block, sweep_moe_block, sweep_moe_experts, sweep_moe_router,
    unavailable_expert_paths,
)
from .check.device_table import dispatching_by
from .check.rule import with_tolerances
from .measure import dims as D
from .measure.call_costs import call_costs, merged_costs
from .measure.ceilings import ceilings_for
from .measure.point import Settings
from .measure.progress import Progress
from .measure.prune import Pruner
from .measure.timing import L2Flusher, device_identity, graphs_supported, triton_version, warm_device
from .step.point import STEP_GATE_BATCHES, StepPoints, step_model_config
from .table.build import build_table, write_table
from .table.record import new_timings, run_meta
from .table.report import format_rows, layer_breakdown, write_report
from .table.sweeps import merge_sweeps
from .table.targets import judge_targets

__all__ = ["run"]

TINY_LAYER_POINTS = ((1, 64), (1, 1), (8, 1))


def _dims(a) -> D.TuneDims:
    if a.hf_config is not None:
        return D.dims_from_hf_config(a.hf_config, a.tp)
    return D.REAL_PER_RANK if a.dims == "real" else D.TINY


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def run(a) -> int:
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, a.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    dims = _dims(a)
    name = _device_name(device)
    stem = table_file_name(name).removesuffix(".json")
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    report_dir = a.report_dir or Path("runs") / "tune" / f"{stem}-{today}"
    table_dir = a.table_dir or (CHECKOUT_TABLE_DIR if device.type == "cuda" else report_dir)
    graphs = graphs_supported(device) and not a.no_graph
    prefer_graph = {"auto": graphs, "graph": True, "eager": False}[a.select_by]
    ceilings = ceilings_for(stem, a.hbm_tbps, a.peak_tflops)
    s = Settings(device, dtype, a.reps, a.warmup, graphs, L2Flusher(device, a.flush_mb * 2**20))
    real = dims.name == D.REAL_PER_RANK.name
    moe_tokens = a.moe_tokens or D.MOE_TOKENS
    block_tokens = a.moe_block_tokens or D.MOE_BLOCK_TOKENS
    prefill = a.gdn_prefill_tokens or D.GDN_PREFILL_TOKENS
    decode = a.gdn_decode_batches or D.GDN_DECODE_BATCHES
    layer_points = () if a.no_layer else (LAYER_POINTS if real else TINY_LAYER_POINTS)
    conv_tokens, norm_rows = conv_points(prefill), norm_points(prefill, decode)
    do_gdn, do_moe = a.target in ("all", "gdn"), a.target in ("all", "moe")
    do_attention, do_norm = a.target in ("all", "attention"), a.target in ("all", "norm")
    do_step = a.target == "all" and not a.sweep_configs and not a.no_table  # it runs the table this run writes
    context = D.attention_context(dims)
    sweeps = 1 if a.sweep_configs else a.sweeps  # a config sweep ranks configs, not paths: one pass
    graphed_tokens = graphed_block_tokens(block_tokens, device)
    steps = sweeps * ((len(prefill) + len(decode) + len(conv_tokens) + len(norm_rows) + len(layer_points)) * do_gdn
                      + (len(moe_tokens) + 2 * len(block_tokens) + len(graphed_tokens)) * do_moe
                      + len(decode) * do_attention + len(norm_rows) * do_norm + len(STEP_GATE_BATCHES) * do_step)
    if a.sweep_configs:
        from .configs import sweep as config_sweep

        why = config_sweep.why_no_config_sweep(a.target, device, dtype, dims.name)
        if why:
            print(f"qwen36 tune --sweep-configs: {why}", file=sys.stderr)
            return 2
        steps = config_sweep.config_sweep_steps(moe_tokens, s, a.compile_workers)
    progress = Progress(steps, enabled=not a.no_progress, unit="config" if a.sweep_configs else "point")
    command = shlex.join(getattr(a, "invocation", None) or ["qwen36", *sys.argv[1:]])
    meta = {
        "device": name, "device_stem": stem, "date": today, "command": command, "torch": torch.__version__,
        "triton": triton_version(), "dtype": str(dtype).removeprefix("torch."), "dims": dims.as_dict(),
        "ceilings": {"hbm_bytes_per_s": ceilings.hbm_bytes_per_s, "matrix_flops_per_s": ceilings.matrix_flops_per_s,
                     "source": ceilings.source},
        "timing": (f"median of {a.reps} samples (spread = IQR / median); before each sample a {a.flush_mb} MB buffer "
                   f"is written (L2 flush) and the device synchronised; {a.warmup} warm-up calls; CUDA events"
                   if device.type == "cuda" else f"median of {a.reps} host-clock samples, {a.warmup} warm-up calls"),
        "graphs": graphs, "ranked_by": "graph replay where captured, else eager" if prefer_graph else "eager",
    }
    recorded = {"date": today, "command": meta["command"], "torch": torch.__version__, "dims": dims.name,
                "reps": a.reps, "warmup": a.warmup, "flush_mb": a.flush_mb, "sweeps": sweeps}
    meta["sweeps"] = sweeps
    rows, notes, costs = [], [], []
    # GDN paths are all timed everywhere (the project's against fla's is the question); MoE sweeps prune.
    gdn_pruner, moe_pruner = Pruner(float("inf"), prefer_graph), Pruner(a.prune_factor, prefer_graph)
    config_pruners = defaultdict(lambda: Pruner(a.prune_factor, prefer_graph))  # one per Triton path
    table, sections = None, []

    def finish_phase():
        nonlocal table, sections
        # One row per point and path: the median of its sweeps, each sweep kept. A config sweep is one pass.
        merged = rows if a.sweep_configs else merge_sweeps(rows)
        verdicts = judge_targets(merged) if real else []
        # A config sweep measures configs that do not serve yet, not paths: the dispatch table stays as it is.
        if not a.no_table and not a.sweep_configs:
            timings = with_tolerances(new_timings(
                merged, f"{meta['timing']}; each value one sweep's median",
                run_meta(0, today, command, sweeps, torch=torch.__version__, triton=meta["triton"],
                         call_costs=merged_costs(costs), **device_identity(device))))
            table = build_table(merged, name, meta["dtype"], prefer_graph, recorded, timings)
            path = write_table(table, table_dir / table_file_name(name))
            meta["table_path"] = str(path)
        if a.sweep_configs:
            sections = [config_sweep.config_sweep_section(merged, prefer_graph, meta["ranked_by"])]
        pruners = (gdn_pruner, moe_pruner, *config_pruners.values())
        dropped = [why for p in pruners for _, why in p.dropped.values()]
        write_report(report_dir, meta, merged, table, verdicts, notes + dropped, sections)
        return verdicts

    stopped = []

    def phase(label, sweep):
        """Run one sweep; a failure outside the per-path checks (a reference, the device), a SIGTERM (a time
        limit) or Ctrl-C is noted and what was measured is written; after a SIGTERM or Ctrl-C no further
        sweep starts."""
        if stopped:
            return []
        try:
            sweep()  # appends to `rows` as it measures
        except (Exception, KeyboardInterrupt) as exc:
            if isinstance(exc, (Terminated, KeyboardInterrupt)):
                stopped.append(exc)
            notes.append(f"{label} stopped: {type(exc).__name__}: {str(exc).strip()[:300]}")
            print(f"qwen36 tune: {label} stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        return finish_phase()

    signal.signal(signal.SIGTERM, _raise_terminated)

    verdicts = []
    passes = range(1, sweeps + 1)
    def at(i: int) -> Settings:
        """Sweep i's settings: the first counts each point's launches (exact, so once; outside later sweeps' times)."""
        return replace(s, count_launches=i == 1)

    try:
        warm_device(device)
        costs.append(call_costs(device, dtype, s.flusher, s.reps))
        meta["call_costs"] = merged_costs(costs)
        if do_gdn:
            notes.extend(f"GDN path {n} unavailable: {why}" for n, why in unavailable_rule_paths(s).items())
            notes.append("recurrent_reference (the float64 definition) is the check, not a candidate")
            notes.extend(f"GDN {n} unavailable: {why}" for n, why in unavailable_stage_paths(s).items())
            for i in passes:
                verdicts = phase(f"gdn rule sweep {i}/{sweeps}", lambda: sweep_gdn(
                    dims.gdn, prefill, decode, at(i), ceilings, gdn_pruner, progress.tick, rows))
            for i in passes:
                verdicts = phase(f"gdn conv and gated norm sweep {i}/{sweeps}", lambda: (
                    sweep_gdn_conv(dims.gdn, conv_tokens, at(i), ceilings, progress.tick, rows),
                    sweep_gated_norm(dims.gdn, norm_rows, at(i), ceilings, progress.tick, rows)))
            if layer_points:
                # The layer runs what this run's table serves (its ranges, token limits included), else defaults.
                planned = parse_dispatch_table(build_table(merge_sweeps(rows), name, meta["dtype"], prefer_graph,
                                                           recorded), "this run's table")
                for i in passes:
                    verdicts = phase(f"gdn layer {i}/{sweeps}", lambda: time_gdn_layer(
                        dims.gdn, at(i), lambda b, t: _layer_rule(planned, b, t), progress.tick, layer_points, rows,
                        conv_for=lambda b, t: _planned(planned, "gdn_conv", t, select_conv_path(t)),
                        norm_for=lambda b, t: _planned(planned, "gdn_gated_norm", b * t, select_gated_norm_path(b * t))))
        if do_attention or do_norm:
            notes.extend(f"{n} unavailable: {why}" for n, why in unavailable_step_block_paths(s).items())
        if do_attention:
            for i in passes:
                verdicts = phase(f"attention decode layer sweep {i}/{sweeps}", lambda: sweep_attention_layer(
                    dims.attention, decode, context, at(i), ceilings, progress.tick, rows))
        if do_norm:
            for i in passes:
                verdicts = phase(f"add + rms norm sweep {i}/{sweeps}", lambda: sweep_add_rms_norm(
                    dims.attention.hidden_size, dims.attention.eps, norm_rows, at(i), ceilings, progress.tick, rows))
        if a.sweep_configs:
            verdicts = phase("moe config sweep", lambda: config_sweep.sweep_configs(
                dims.moe, moe_tokens, s, ceilings, config_pruners, progress.tick, rows, notes, a.compile_workers))
        elif do_moe:
            notes.extend(f"MoE path {n}: {why}" for n, why in unavailable_expert_paths(s).items())
            notes.append("reference (the float64 definition) is the check, not a candidate")
            from .measure.inputs import moe_weights

            w = moe_weights(dims.moe, dtype, device)
            for i in passes:
                verdicts = phase(f"moe experts sweep {i}/{sweeps}", lambda: sweep_moe_experts(
                    dims.moe, moe_tokens, at(i), ceilings, moe_pruner, progress.tick, w, rows))
            for i in passes:
                verdicts = phase(f"moe block sweep {i}/{sweeps}", lambda: sweep_moe_block(
                    dims.moe, block_tokens, at(i), ceilings, moe_pruner, progress.tick, w, rows))
            for i in passes:  # the routers alone at the block's token counts; the dispatch table records none
                verdicts = phase(f"moe router sweep {i}/{sweeps}", lambda: sweep_moe_router(
                    dims.moe, block_tokens, s, progress.tick, w, rows))
            for i in passes:  # item 4 of the eager-decode work: a per-bucket graph's cost to an eager caller
                verdicts = phase(f"moe block graphed sweep {i}/{sweeps}", lambda: sweep_graphed_block(
                    dims.moe, graphed_tokens, s, ceilings, progress.tick, w, rows))
            del w
        if do_step and table is not None:  # last: the whole step served by the table the phases above wrote
            step = StepPoints(step_model_config(dims.name, a.hf_config, a.tp), s)
            with dispatching_by(meta["table_path"]):
                for i in passes:
                    verdicts = phase(f"decode step sweep {i}/{sweeps}", lambda: step.sweep(
                        STEP_GATE_BATCHES, progress.tick, rows, at(i)))
            del step
    finally:
        progress.close()
    rows = rows if a.sweep_configs else merge_sweeps(rows)
    if not a.sweep_configs:  # a config sweep's candidates are too many for the console: the report lists them
        for block in dict.fromkeys(r.block for r in rows):
            print(format_rows(rows, block) + "\n")
    for section in sections:
        print("\n".join([section.title, "", *section.lines]))
    for line in layer_breakdown(rows):
        print("GDN layer " + line)
    for v in verdicts:
        print("target " + v.line())
    print(f"report: {report_dir / 'tune.md'} and tune.json" + (f"; table: {meta['table_path']}" if table else ""))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    wrong = [r for r in rows if r.status == "wrong"]
    for r in wrong:
        print(f"WRONG: {r.block} {r.key} {r.path}: {r.detail}", file=sys.stderr)
    # A sweep point where no candidate ran correctly has nothing to choose from: the run has failed there.
    unchosen = [f"{path} T={t}" for section in sections for path, result in section.data.items()
                for t, choice in result["points"].items() if choice["winner"] is None]
    if unchosen:
        print(f"NO CORRECT CONFIG at {', '.join(unchosen)}: see the errors in the report", file=sys.stderr)
    if any(isinstance(exc, KeyboardInterrupt) for exc in stopped):
        return 130  # the shell's code for Ctrl-C: what was measured is written, but the run is not complete
    return 1 if wrong or unchosen else 0


class Terminated(Exception):
    """SIGTERM arrived (e.g. `timeout`): stop measuring, keep what was measured."""


def _raise_terminated(signum, frame):
    raise Terminated(f"signal {signum}")


def _planned(table: DispatchTable, block: str, key: int, default: str) -> str:
    """The path `table` serves `block` at `key` with, else the block's default."""
    return table.path_for(block, key, None) or default


def _layer_rule(table: DispatchTable, batch: int, tokens: int) -> str:
    """The rule path the table serves this layer call with, else the default."""
    block, key = ("gdn_decode", batch) if tokens == 1 else ("gdn_prefill", tokens)
    return _planned(table, block, key, select_rule_path(tokens, batch))
