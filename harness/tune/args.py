"""The `tune` command's arguments, importing nothing heavy (the `qwen36` CLI builds every parser at start)."""
from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments", "add_parser", "run_command"]

FLUSH_MB = 256


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated positive integers like 1,8,64") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated positive integers like 1,8,64")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", choices=("all", "moe", "gdn", "attention", "norm", "step"), default="all",
                   help="moe: routed experts + whole block; gdn: delta rule, the staged layer's conv and gated "
                        "norm, and the layer by stage; attention: the full-attention layer at one token per "
                        "sequence; norm: the residual add + RMSNorm between blocks; all: every one of these; "
                        "step: the whole per-rank decode step, eager, by block kind (writes no table)")
    p.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    p.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default=None,
                   help="default: bfloat16 on CUDA (serving), float32 on a CPU")
    p.add_argument("--dims", choices=("real", "tiny"), default="real",
                   help="real: Qwen3.6-35B-A3B per rank at TP=4; tiny: the same ratios, seconds on a CPU")
    p.add_argument("--hf-config", type=Path, default=None, help="dims from this checkpoint dir's config.json instead")
    p.add_argument("--tp", type=int, default=4,
                   help="with --hf-config, and for step: tensor-parallel ranks to split over")
    p.add_argument("--moe-tokens", type=_ints, default=None, help="default: 1..16, then 32, 64, ..., 8192")
    p.add_argument("--moe-block-tokens", type=_ints, default=None,
                   help="default: 1,8,4096")
    p.add_argument("--gdn-prefill-tokens", type=_ints, default=None,
                   help="default: 64,128,...,16384 (the conv's points too, with T=1, and the gated norm's rows)")
    p.add_argument("--gdn-decode-batches", type=_ints, default=None,
                   help="default: 1,8,64,256 (the gated norm's and the add + RMSNorm's rows too, and the "
                        "attention decode layer's batches)")
    p.add_argument("--no-layer", action="store_true", help="gdn: skip the layer's stage-by-stage timing")
    p.add_argument("--step-batches", type=_ints, default=None, help="step: decode batch sizes (default: 1,8,64)")
    p.add_argument("--step-prefill", type=_positive, default=None,
                   help="step: prompt tokens per sequence before the timed step (default: 256)")
    p.add_argument("--router", default=None,
                   help="step: the router path the model runs (model.moe ROUTERS; default: the model's, topk_softmax)")
    p.add_argument("--norm", default=None,
                   help="step: force one path of every RMSNorm (model.norm.rms_norm's tables: the residual add + "
                        "RMSNorm between blocks, the q/k norms, the GDN gated norm). Default: the served choice of "
                        "each. A forced path also keeps the GDN and attention decode layers staged")
    p.add_argument("--reps", type=int, default=20, help="timed samples per path and point (median reported)")
    p.add_argument("--sweeps", type=_positive, default=3,
                   help="passes over every point (each a median of --reps samples); the table keeps every pass, "
                        "and the GPU perf gate sizes each point's tolerance from how far they differ")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (compilation, autotuning)")
    p.add_argument("--no-graph", action="store_true", help="eager timing only (CUDA graphs are never used on a CPU)")
    p.add_argument("--no-through-ops", action="store_true",
                   help="step: leave out the step with the served blocks called through the plugin's ops (the calls "
                        "a compiled vLLM makes), timed beside the direct one")
    p.add_argument("--select-by", choices=("auto", "graph", "eager"), default="auto",
                   help="how the table ranks paths: auto = graph replay where the platform has graphs; "
                        "eager for a server run with --enforce-eager")
    p.add_argument("--prune-factor", type=float, default=8.0,
                   help="moe: drop a path from larger points once it is this many times slower than the "
                        "best there and costs over 1 ms a call")
    p.add_argument("--flush-mb", type=int, default=FLUSH_MB, help="L2 flush buffer written before each sample")
    p.add_argument("--hbm-tbps", type=float, default=None, help="memory bandwidth for the floors (default: per device)")
    p.add_argument("--peak-tflops", type=float, default=None, help="matrix rate for the floors (default: per device)")
    p.add_argument("--table-dir", type=Path, default=None,
                   help="where the device's table goes (default on CUDA: the checkout's fixtures/dispatch; on a CPU: "
                        "the report dir, since CPUs read a table only when QWEN36_DISPATCH_TABLE names it)")
    p.add_argument("--no-table", action="store_true", help="measure and report only")
    p.add_argument("--report-dir", type=Path, default=None, help="default: runs/tune/<device>-<date>")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--sweep-configs", action="store_true",
                   help="moe: instead of choosing between expert paths, time each Triton path's candidate block "
                        "configs per token count (harness/tune/configs/space.py) and report the fastest correct "
                        "one next to the registered one, with the table to paste into model/moe/triton_*.py; "
                        "writes no dispatch table")
    g = p.add_argument_group("GPU perf gate (docs/tuning.md): check this device against its table's timings")
    g.add_argument("--check", action="store_true",
                   help="the routine gate: re-time each path the table dispatches, the MoE block and the GDN layer "
                        "(--sweeps passes, as recorded) and fail on a point slower beyond its tolerance")
    g.add_argument("--check-stale", action="store_true",
                   help="the full check: the routine gate plus every available path at every dispatch point; "
                        "fails where another path beats the table's choice beyond the tolerance")
    g.add_argument("--table", type=Path, default=None,
                   help="the table to check against (default: this device's in the checkout's fixtures/dispatch)")
    g.add_argument("--add-run", action="store_true",
                   help="add this check's times to the table's timings as another run, whatever the timing "
                        "verdict (not after wrong outputs), and commit the table: run on the commit that recorded "
                        "it, on another machine or day, so each point's tolerance covers how far it moves between "
                        "machines")
    g.add_argument("--add-run-from", type=Path, default=None, metavar="CHECK_JSON",
                   help="add the run of an earlier check's report (runs/tune/...-check-.../check.json) to the "
                        "table's timings, as --add-run would have, without measuring again (--table: which table)")
    g.add_argument("--ab", type=Path, default=None, metavar="REF_DIR",
                   help="same-run A/B: time the model package of REF_DIR (a git worktree or a plain copy of a "
                        "reference checkout) interleaved with this checkout's, at the routine gate's points, and "
                        "fail where this checkout is slower beyond the tolerance in every sweep; for a box whose "
                        "clocks differ from the recording's")
    g.add_argument("--inject-delay", action="append", metavar="[BLOCK:]PATH=US",
                   help="test-only: make a registered path wait US microseconds before every call (GPU: a "
                        "sleep kernel, so one more launch too; CPU: a spin), to show what the gate catches; "
                        "BLOCK names the registry where the path's name is in several (moe_block:triton_fused_block, "
                        "add_rms_norm:triton); repeatable")
    p.add_argument("--compile-workers", type=int, default=8,
                   help="--sweep-configs on a GPU: processes that compile the candidates in parallel first "
                        "(Triton's disk cache keeps them for the sweep); 0 or 1: each compiles as it is first timed")


def add_parser(sub) -> None:
    t = sub.add_parser("tune", help="time every MoE expert path and GDN rule path on this device; write its "
                                    "dispatch table and a report")
    add_arguments(t)
    t.set_defaults(handler=run_command)


def run_command(a) -> int:
    """Route parsed `tune` arguments to the step timing, the A/B, the gate or the recording."""
    if a.target == "step":
        from .step.run import run_step  # torch and the model load only when the command runs

        return run_step(a)
    if a.add_run_from is not None:
        from .check.add_run import add_reported_run

        return add_reported_run(a.add_run_from, a.table)
    if a.ab is not None:
        from .ab.run import run_ab_command  # torch and the model load only when the command runs

        return run_ab_command(a)
    if a.check or a.check_stale:
        from .check.run import run_check  # torch and the model load only when the command runs

        return run_check(a)
    from .cli import run

    return run(a)
