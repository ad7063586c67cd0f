"""The `qwen36 baseline record`, `qwen36 gate` and `qwen36 compare` subcommands."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import HarnessError

EXIT_REGRESSION = 1


def _pairs(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        base, sep, cand = item.partition("=")
        if not sep or not base or not cand:
            raise argparse.ArgumentTypeError(f"{item!r}: expected BASELINE_POINT=CANDIDATE_POINT")
        out[base] = cand
    return out


def _accept(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_parsers(sub) -> None:
    b = sub.add_parser("baseline", help="record a perf-gate baseline")
    bsub = b.add_subparsers(dest="baseline_cmd", required=True)
    r = bsub.add_parser("record", help="run the profile's workload N times and write fixtures/baselines/P.yaml")
    r.add_argument("--profile", required=True, help="baseline name, e.g. cpu-tiny")
    r.add_argument("--repeats", type=int, default=5)
    r.add_argument("--preset", default="gate", help="bench preset to measure (default: gate)")
    r.add_argument("--base-url", "--server-url", dest="base_url", default=None,
                   help="a running server (default: start the embedded tiny vLLM CPU server)")
    r.add_argument("--hardware", default=None, help="describe the hardware (default: from the host)")
    r.add_argument("--tolerance-floor", type=float, default=None,
                   help="minimum relative tolerance for this profile (e.g. 0.08): drift between machines or "
                        "server starts that repeats within one run cannot show; written into the baseline")
    r.add_argument("--warmups", type=int, default=None,
                   help="repeats measured first and left out of the baseline (default: 2, what a freshly started "
                        "server needs for its prefix cache to settle; 0 for a server that just ran the workload)")
    r.add_argument("--tokenizer", type=Path, default=None,
                   help="with --base-url: the served model's tokenizer.json or its directory, to size official-like "
                        "prompts as the server counts them (default: about 4 characters a token)")
    r.add_argument("--update", action="store_true", help="replace an existing baseline and print the diff")
    r.add_argument("--out", type=Path, default=None, help="runs root (default: runs/)")
    r.set_defaults(handler=_cmd_record)

    g = sub.add_parser("gate", help="gate run directories against a baseline; exit 1 on a regression")
    g.add_argument("runs", nargs="+", type=Path, help="run directories of `qwen36 bench` (their repeats pool)")
    g.add_argument("--profile", required=True)
    g.add_argument("--accept-difference", type=_accept, default=[],
                   help="identity fields allowed to differ, comma-separated (datasets, model, model_files_sha256, "
                        "server_args); the report lists them")
    g.add_argument("--point", type=_pairs, default={}, help="pair points: BASELINE=CANDIDATE[,...]")
    g.add_argument("--out", type=Path, default=None, help="where gate.md and gate.json go (default: the first run)")
    g.add_argument("--baselines-dir", type=Path, default=None, help=argparse.SUPPRESS)  # tests: another root
    g.set_defaults(handler=_cmd_gate)

    c = sub.add_parser("compare", help="A/B: per-point ratios and geometric means of two run directories")
    c.add_argument("run_a", type=Path)
    c.add_argument("run_b", type=Path)
    c.add_argument("--accept-difference", type=_accept, default=[])
    c.add_argument("--out", type=Path, default=None, help="write compare.md here (default: run B)")
    c.set_defaults(handler=_cmd_compare)


def _cmd_record(a) -> int:
    from harness.gates.record import record_baseline

    _, diff = record_baseline(a.profile, a.repeats, a.preset, a.base_url, a.update, a.out, hardware=a.hardware,
                              tolerance_floor=a.tolerance_floor, tokenizer=a.tokenizer,
                              **({"warmups": a.warmups} if a.warmups is not None else {}))
    if diff:
        print(diff)
    return 0


def _cmd_gate(a) -> int:
    from harness.gates.baseline import BASELINES_DIR, load_baseline
    from harness.gates.gate import gate, load_run, report_markdown, write_report
    from harness.metrics import Scoring

    baseline = load_baseline(a.profile, a.baselines_dir or BASELINES_DIR)
    try:
        report = gate(baseline, [load_run(r) for r in a.runs], Scoring.load(), accept=a.accept_difference,
                      point_map=a.point)
    except ValueError as e:  # an unknown --accept-difference field
        raise HarnessError(str(e)) from e
    print(report_markdown(report))
    md, js = write_report(report, a.out or a.runs[0])
    print(f"report: {md} and {js}", file=sys.stderr)
    return 0 if report.passed else EXIT_REGRESSION


def _cmd_compare(a) -> int:
    from harness.gates.compare import compare_runs, comparison_markdown
    from harness.gates.gate import load_run

    try:
        result = compare_runs(load_run(a.run_a), load_run(a.run_b), accept=a.accept_difference)
    except ValueError as e:
        raise HarnessError(str(e)) from e
    text = comparison_markdown(result)
    print(text)
    out = (a.out or a.run_b) / "compare.md"
    out.write_text(text)
    print(f"report: {out}", file=sys.stderr)
    return 0
