"""The `qwen36` command. Library errors become one line on stderr and exit code 2."""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from pathlib import Path

from harness.errors import HarnessError


def _int_list(text: str, minimum: int, what: str, example: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated {what} like {example}") from None
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {what} >= {minimum} like {example}")
    return values


def _ints(text: str) -> tuple[int, ...]:
    return _int_list(text, 1, "positive integers", "1,2,4")


def _cpus(text: str) -> tuple[int, ...]:
    return _int_list(text, 0, "core ids", "1 or 2,3")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qwen36", description="Qwen3.6 serving harness")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tiny-model", help="write the deterministic tiny random Qwen3-Next checkpoint")
    t.add_argument("dir", type=Path)
    t.add_argument("--seed", type=int, default=None, help="overrides the recipe's seed")

    s = sub.add_parser("serve", help="start the embedded vLLM CPU server and keep it up until Ctrl-C")
    s.add_argument("--model", type=Path, default=None, help="model directory (default: build the tiny model)")
    s.add_argument("--port", type=int, default=0, help="default: a free loopback port")
    s.add_argument("--max-model-len", type=int, default=8192)
    s.add_argument("--chat-template", type=Path, default=None)
    s.add_argument("--run-dir", type=Path, default=Path("runs/serve"), help="where server.log goes")
    s.add_argument("--command", default=None,
                   help="a full server command instead of vLLM's ({port} is substituted), e.g. a wrapper script")
    s.add_argument("--served-model-name", default="tiny-qwen36",
                   help="the model name the readiness generation asks for")
    s.add_argument("--no-placement", action="store_true",
                   help="leave vLLM's processes where vLLM puts them (default: the engine core with the "
                        "worker, the API server on another core; harness/serving/placement.py)")

    b = sub.add_parser("bench", help="measure the platform's metrics against a server")
    b.add_argument("--base-url", "--server-url", dest="base_url", default=None,
                   help="a running OpenAI-compatible server, e.g. http://10.0.0.5:8000 "
                        "(default: start the embedded tiny vLLM CPU server)")
    b.add_argument("--model", default=None, help="model name to request (default: the server's first model)")
    b.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="the key the server wants (vLLM's --api-key), sent as a Bearer token (default: $OPENAI_API_KEY)")
    b.add_argument("--preset", choices=("quick", "gate", "bi-v100-ledger"), default=None,
                   help="quick: decode-micro at c=1,2,4 and a small official-like run (what `make bench` runs); "
                        "gate: the perf gate's workload (decode-micro and official-like at c=2); "
                        "bi-v100-ledger: the bi-v100-tp4-245k baseline's (official-like, 8 requests at c=1)")
    b.add_argument("--dataset", choices=("decode-micro", "official-like", "matrix", "replay"), default=None)
    b.add_argument("--concurrency", type=_ints, default=(1,), help="comma-separated, e.g. 1,2,4")
    b.add_argument("--requests", type=int, default=None, help="requests per point")
    b.add_argument("--output-tokens", type=int, default=None)
    b.add_argument("--input-tokens", type=_ints, default=(128,), help="matrix: comma-separated input lengths")
    b.add_argument("--replay-file", type=Path, default=None)
    b.add_argument("--tokenizer", type=Path, default=None,
                   help="tokenizer.json or its directory, to size official-like prompts (default: the tiny "
                        "model's, or 4 characters per token against a remote server)")
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--sweep", action="store_true",
                   help="treat --concurrency as a sweep that stops on errors, SLO, saturation or regression")
    b.add_argument("--ttft-slo", type=float, default=None, help="sweep: stop when TTFT P90 exceeds this (s)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", type=Path, default=None, help="runs root (default: runs/ in the checkout)")
    b.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--no-placement", action="store_true",
                   help="embedded server: leave vLLM's processes where vLLM puts them (harness/serving/placement.py)")
    b.add_argument("--client-cpus", type=_cpus, default=None,
                   help="a server on this machine: run the client on these cores, e.g. 1 (what `qwen36 serve` "
                        "prints); default: where it is")
    b.add_argument("--keep-stalled", action="store_true",
                   help="keep stalled streams in the timing percentiles even against a loopback server")
    b.add_argument("--machine-speed", action="store_true",
                   help="a server on this machine: measure the machine's speed probe before and after, so that "
                        "`qwen36 gate` can rescale a baseline recorded on another day (docs/perf-gates.md)")

    from harness.gates.commands import add_parsers as add_gate_parsers

    add_gate_parsers(sub)  # baseline record, gate, compare: each sets its own `handler`

    from harness.tune.args import add_parser as add_tune_parser

    add_tune_parser(sub)  # tune [moe|gdn|all]: per-device dispatch table and report (harness/tune)

    from harness.history.cli import add_parser as add_history_parser

    add_history_parser(sub)  # history add|backfill|publish|serve: every gated figure over commits (harness/history)

    # patch set and presubmit (harness/presubmit, patches/)
    pt = sub.add_parser("patches", help="the vLLM patch plugin")
    pt_sub = pt.add_subparsers(dest="patches_cmd", required=True)
    ps = pt_sub.add_parser("status", help="the patch table for the installed vLLM (starts no server)")
    ps.add_argument("--run-config", type=Path, default=None,
                    help="evaluate with this run config's environment (e.g. computility-run.yaml)")
    ps.add_argument("--require", action="store_true", help="exit 1 unless every required patch is applied")
    pre = sub.add_parser("presubmit", help="go/no-go before pushing the platform image")
    pre.add_argument("--root", type=Path, default=None, help="checkout to check (default: this one)")
    pre.add_argument("--skip-suites", action="store_true", help="static checks only (no pytest run)")
    pre.add_argument("--server-url", default=None, help="run API conformance against this server")
    pre.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                     help="with --server-url: the key the server wants (default: $OPENAI_API_KEY)")
    return p


def _cmd_patches(a) -> int:
    import os

    from patches.core.registry import apply_patches, format_table, missing_required
    from patches.settings import PatchSettings

    env = dict(os.environ)
    if a.run_config:
        from harness.presubmit.runconfig import load_run_config

        env.update(load_run_config(a.run_config).env)
    try:
        settings = PatchSettings.from_env(env)
    except ValueError as exc:
        raise HarnessError(str(exc)) from None
    statuses = apply_patches(settings)
    print(format_table(statuses))
    return 1 if a.require and missing_required(statuses) else 0


def _cmd_presubmit(a) -> int:
    from harness.paths import REPO_ROOT
    from harness.presubmit import format_verdict, run_presubmit

    verdict = run_presubmit(a.root or REPO_ROOT, skip_suites=a.skip_suites, server_url=a.server_url,
                            api_key=a.api_key)
    print(format_verdict(verdict))
    return 0 if verdict.go else 1


def _cmd_tiny_model(a) -> int:
    from harness.serving.tiny_model import TinyRecipe, build_tiny_model, checkpoint_digest

    out = build_tiny_model(a.dir, TinyRecipe.load(seed=a.seed))
    for name, digest in checkpoint_digest(out).items():
        print(f"{digest}  {out / name}")
    return 0


def _cmd_serve(a) -> int:
    from harness.serving.launcher import embedded_server, until_signalled

    server = embedded_server(a.run_dir, a.model, served_model_name=a.served_model_name, port=a.port,
                             max_model_len=a.max_model_len,
                             command=tuple(shlex.split(a.command)) if a.command else None,
                             place_processes=not a.no_placement,
                             **({"chat_template": a.chat_template} if a.chat_template else {}))
    print(f"starting: {server.command_line}\nlog: {server.log_path}", file=sys.stderr)
    if server.layout:
        print(f"placement: {server.layout.describe()}; a client on this machine: "
              f"qwen36 bench --client-cpus {','.join(map(str, server.layout.frontend))}", file=sys.stderr)
    # While it starts, both end it cleanly (SIGINT explicitly, as a background job may inherit it ignored); once
    # up, until_signalled takes them over.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with server:
        announce = lambda: print(f"ready: {server.base_url}  (Ctrl-C stops it)", flush=True)  # noqa: E731
        if not until_signalled(lambda: server.proc is not None and server.proc.poll() is None, announce):
            server.check_alive()  # raises ServerDied with the log's tail
        print("stopping", file=sys.stderr)
    return 0


def _cmd_bench(a) -> int:
    from harness.bench.run import PRESETS, BenchConfig, Workload
    from harness.paths import RUNS_DIR
    from harness.bench.runner import SweepPolicy

    if a.preset and a.dataset:
        raise HarnessError("give either --preset or --dataset, not both")
    if a.preset or not a.dataset:
        workloads = PRESETS[a.preset or "quick"]
    else:
        workloads = (Workload(a.dataset, a.concurrency, a.requests, a.output_tokens, a.input_tokens, a.replay_file),)
    cfg = BenchConfig(
        workloads=workloads, base_url=a.base_url, model=a.model, api_key=a.api_key, tokenizer=a.tokenizer,
        seed=a.seed, repeats=a.repeats, sweep=a.sweep, sweep_policy=SweepPolicy(ttft_slo_s=a.ttft_slo),
        out_root=a.out or RUNS_DIR, label=(a.preset or a.dataset or "quick"), timeout_s=a.timeout,
        show_progress=not a.no_progress, place_processes=not a.no_placement, client_cpus=a.client_cpus,
        exclude_stalled=False if a.keep_stalled else None, machine_speed=a.machine_speed,
    )
    from harness.bench.run import run_bench

    run_bench(cfg)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.invocation = ["qwen36", *(sys.argv[1:] if argv is None else argv)]  # as typed, for reports and records
    handlers = {"tiny-model": _cmd_tiny_model, "serve": _cmd_serve, "bench": _cmd_bench,
                "patches": _cmd_patches, "presubmit": _cmd_presubmit}
    try:
        handler = getattr(args, "handler", None) or handlers[args.cmd]
        return handler(args)
    except HarnessError as exc:
        first, _, rest = str(exc).partition("\n")
        print(f"qwen36 {args.cmd}: error: {first}", file=sys.stderr)
        if rest:  # e.g. a server log tail: useful, but after the one-line verdict
            print(rest, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"qwen36 {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
