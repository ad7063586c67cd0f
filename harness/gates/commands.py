"""The `qwen36 baseline record`, `qwen36 gate`, `qwen36 compare`, `qwen36 ab` and `qwen36 reference` subcommands."""
from __future__ import annotations

import argparse
import contextlib
import os
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
    r.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="with --base-url: the key the server wants (vLLM's --api-key; default: $OPENAI_API_KEY)")
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

    ab = sub.add_parser("ab", help="interleaved A/B of two servers on this machine: paired verdict, exit 1 when B "
                                   "regresses against A (a flagged check is measured again first); without URLs, the performance reference commit's embedded "
                                   "server (A) against this checkout's (B)")
    ab.add_argument("--a", default=None, metavar="URL", help="the reference server (default: start the performance "
                                                             "reference commit's, fixtures/gates/reference.yaml)")
    ab.add_argument("--b", default=None, metavar="URL", help="the candidate server (default: start this checkout's)")
    ab.add_argument("--preset", default="paired",
                    help="bench preset whose points each block runs (default: paired, CI's short blocks, what "
                         "fixtures/gates/paired.yaml's tolerances were sized for; other presets' points take "
                         "fixtures/gates/policy.yaml's)")
    ab.add_argument("--pairs", type=int, default=None,
                    help="pairs of blocks (default: fixtures/gates/paired.yaml's, what its tolerances were sized for)")
    ab.add_argument("--tokenizer", type=Path, default=None,
                    help="the served model's tokenizer.json or its directory (sizes official-like prompts)")
    ab.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                    help="sent to both servers (default: $OPENAI_API_KEY)")
    ab.add_argument("--client-cpus", type=_cpus, default=None,
                    help="run the client on these cores (what `qwen36 serve` prints), e.g. 1")
    ab.add_argument("--out", type=Path, default=None, help="runs root (default: runs/)")
    ab.set_defaults(handler=_cmd_ab)
    _add_slower_commit_parsers(sub)

    cal = sub.add_parser("calibrate", help="measure CI's paired gates on this machine (A/A controls, a slowed twin) "
                                           "and size their tolerances (docs/perf-gates.md)")
    cal.add_argument("--runs", type=int, default=30, help="interleaved runs, each an A/A control and a detection")
    cal.add_argument("--restart-every", type=int, default=3, help="start both servers again every N runs")
    cal.add_argument("--sizes", default="0.1,0.2",
                     help="step slowdowns of the slowed twin, taken in turn (comma-separated fractions)")
    cal.add_argument("--out", type=Path, default=None, help="runs root (default: runs/)")
    cal.add_argument("--analyse", type=Path, default=None, metavar="DIR",
                     help="analyse a calibration directory measured before instead of measuring")
    cal.add_argument("--resume", type=Path, default=None, metavar="DIR",
                     help="measure on into a calibration directory after the runs it holds (same --runs, "
                          "--restart-every and --sizes as it was started with)")
    cal.add_argument("--write", action="store_true",
                     help="write the sized tolerances into fixtures/gates/paired.yaml")
    cal.set_defaults(handler=_cmd_calibrate)

    ref = sub.add_parser("reference", help="the performance reference commit CI's slower-commit gate measures "
                                           "HEAD against (fixtures/gates/reference.yaml)")
    rsub = ref.add_subparsers(dest="reference_cmd", required=True)
    rsub.add_parser("show", help="print the reference commit").set_defaults(handler=_cmd_reference_show)
    mv = rsub.add_parser("move", help="point the reference at a commit (default HEAD); then commit the file")
    mv.add_argument("rev", nargs="?", default="HEAD")
    mv.add_argument("--note", default="", help="why it moved, kept in the file")
    mv.set_defaults(handler=_cmd_reference_move)
    sv = rsub.add_parser("serve", help="start the reference commit's own server (its `qwen36 serve`, in a git "
                                       "worktree) until Ctrl-C, for `qwen36 ab` by hand")
    sv.add_argument("--model", type=Path, default=None, help="model directory (default: build the tiny model)")
    sv.add_argument("--run-dir", type=Path, default=Path("runs/reference"), help="worktree, logs")
    sv.set_defaults(handler=_cmd_reference_serve)


def _add_slower_commit_parsers(sub) -> None:
    sc = sub.add_parser("slower-commit", help="real slower commits kept as patch fixtures, replayed through `qwen36 ab` "
                                              "against their parent (fixtures/gates/slower-commits/)")
    scsub = sc.add_subparsers(dest="slower_commit_cmd", required=True)
    scsub.add_parser("list", help="the fixtures, what each costs, the checks each should move, whether it applies "
                                  "to HEAD").set_defaults(handler=_cmd_slower_commit_list)
    rp = scsub.add_parser("replay", help="commit the fixture on HEAD in a scratch worktree and run its `qwen36 ab` "
                                         "against HEAD N times (each starts both servers)")
    rp.add_argument("name")
    rp.add_argument("--times", type=int, default=5)
    rp.add_argument("--out", type=Path, default=None, help="default: runs/slower-commits/NAME")
    rp.set_defaults(handler=_cmd_slower_commit_replay)
    sm = scsub.add_parser("summary", help="judge a replay's runs again with fixtures/gates/paired.yaml (no measuring)")
    sm.add_argument("name")
    sm.add_argument("dir", type=Path)
    sm.set_defaults(handler=_cmd_slower_commit_summary)


def _cmd_slower_commit_list(a) -> int:
    from harness.gates.evidence.slower_commits import check_applies, load_slower_commits

    for c in load_slower_commits().values():
        problem = check_applies(c)
        print(f"{c.name}: {c.cost}\n  own checks: {', '.join(f'{p}:{m}' for p, m in c.own)}; "
              f"{'applies to HEAD' if problem is None else 'does NOT apply to HEAD: ' + problem}")
    return 0


def _cmd_slower_commit_replay(a) -> int:
    from harness.gates.evidence.slower_commits import check_applies, load_slower_commits, replay
    from harness.paths import RUNS_DIR

    commits = load_slower_commits()
    if a.name not in commits:
        raise HarnessError(f"no slower commit {a.name!r}; the fixtures: {', '.join(commits)}")
    if a.times < 1:
        raise HarnessError("--times 1 or more")
    commit = commits[a.name]
    if (problem := check_applies(commit)) is not None:
        raise HarnessError(f"{commit.patch} does not apply to HEAD ({problem}); refresh the fixture against HEAD")
    out = replay(commit, a.times, a.out or RUNS_DIR / "slower-commits" / a.name)
    text = (out / "summary.md").read_text()
    print(text)
    return 0


def _cmd_slower_commit_summary(a) -> int:
    from harness.gates.evidence.slower_commits import load_slower_commits, summarise

    commits = load_slower_commits()
    if a.name not in commits:
        raise HarnessError(f"no slower commit {a.name!r}; the fixtures: {', '.join(commits)}")
    summarise(commits[a.name], a.dir)
    print((a.dir / "summary.md").read_text())
    return 0


def _cpus(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected core ids like 1 or 2,3") from None


def _cmd_record(a) -> int:
    from harness.gates.record import record_baseline

    _, diff = record_baseline(a.profile, a.repeats, a.preset, a.base_url, a.update, a.out, hardware=a.hardware,
                              tolerance_floor=a.tolerance_floor, tokenizer=a.tokenizer, api_key=a.api_key,
                              **({"warmups": a.warmups} if a.warmups is not None else {}))
    if diff:
        print(diff)
    return 0


def _cmd_gate(a) -> int:
    from harness.gates.baseline import BASELINES_DIR, load_baseline
    from harness.gates.gate import gate, load_run, report_markdown, write_report
    from harness.bench.metrics import Scoring

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


def _cmd_ab(a) -> int:
    from harness.bench.run import PRESETS, list_models
    from harness.gates.interleave import Arm, interleave
    from harness.gates.confirm import confirm
    from harness.gates.paired import PairedTolerances, paired_gate, write_paired_report
    from harness.paths import RUNS_DIR
    from harness.serving.shared_server import ServerInfo

    if a.preset not in PRESETS:
        raise HarnessError(f"--preset {a.preset!r}: choose one of {', '.join(PRESETS)}")
    if (a.a is None) != (a.b is None):
        raise HarnessError("give both --a URL and --b URL, or neither (then the reference commit's server and this "
                           "checkout's are started here)")
    tolerances = PairedTolerances.load()
    pairs = a.pairs or tolerances.pairs
    out = a.out or RUNS_DIR
    with contextlib.ExitStack() as stack:
        if a.a is None:
            from harness.gates.reference import reference_and_head

            servers = stack.enter_context(reference_and_head(out / "ab-servers"))
        else:
            servers = [ServerInfo(url.rstrip("/"), list_models(url, a.api_key)[0], client_cpus=a.client_cpus,
                                  api_key=a.api_key) for url in (a.a, a.b)]
        arms = [Arm(name, server) for name, server in zip(("A", "B"), servers)]
        run = interleave(arms, PRESETS[a.preset], pairs, out, "ab", tokenizer=a.tokenizer, show_progress=True)
        report = paired_gate(run.path, "A", "B", tolerances)
        md, js = write_paired_report(report, run.path)
        # A flagged check is measured again while both servers are up, and fails only if the pooled pairs flag it.
        result = confirm(report, {arm.label: arm for arm in arms}, PRESETS[a.preset], pairs, out, tolerances,
                         show_progress=True, tokenizer=a.tokenizer)
    print(result.markdown())
    if result.pooled is not None:
        (run.path / "confirmed").mkdir(exist_ok=True)
        md, js = write_paired_report(result.pooled, run.path / "confirmed")
    print(f"report: {md} and {js}", file=sys.stderr)
    return 0 if result.passed else EXIT_REGRESSION


def _cmd_reference_show(a) -> int:
    from harness.gates.reference import load_reference

    ref = load_reference()
    print(f"{ref.commit}  (moved {ref.moved}){'  ' + ref.note if ref.note else ''}")
    return 0


def _cmd_reference_move(a) -> int:
    from harness.gates.reference import move_reference
    from harness.paths import REFERENCE_FILE

    ref = move_reference(a.rev, a.note)
    print(f"performance reference -> {ref.commit}; commit it: git commit {REFERENCE_FILE.relative_to(REFERENCE_FILE.parents[2])} "
          f"-m 'perf reference: {ref.commit[:12]}'")
    return 0


def _cmd_reference_serve(a) -> int:
    from harness.gates.reference import load_reference, serve_reference_until_stopped

    return serve_reference_until_stopped(load_reference(), a.model, a.run_dir)


def _cmd_calibrate(a) -> int:
    from harness.gates.evidence.calibrate import (CalibrationPlan, analyse, load_results, measured_on, report_markdown,
                                         run_calibration, write_tolerances)
    from harness.gates.paired import PairedTolerances
    from harness.paths import RUNS_DIR

    try:
        sizes = tuple(float(x) for x in a.sizes.split(",") if x.strip())
    except ValueError:
        raise HarnessError(f"--sizes {a.sizes!r}: comma-separated fractions like 0.1,0.2") from None
    if a.analyse is None and (a.runs < 4 or a.restart_every < 1 or not sizes):
        raise HarnessError("give --runs 4 or more (a tolerance needs 3 controls besides the one judged), "
                           "--restart-every 1 or more, and one --sizes at least")
    directory = a.analyse or run_calibration(CalibrationPlan(a.runs, a.restart_every, sizes), a.out or RUNS_DIR,
                                             resume=a.resume)
    how = (f"qwen36 calibrate --analyse {a.analyse}" if a.analyse else
           f"qwen36 calibrate --runs {a.runs} --restart-every {a.restart_every} --sizes {a.sizes}")
    analysis = analyse(load_results(directory), PairedTolerances.load())
    text = report_markdown(analysis, how, measured_on(directory))
    (Path(directory) / "report.md").write_text(text)
    print(text)
    if a.write:
        write_tolerances(analysis, how, measured_on(directory))
        print("tolerances written to fixtures/gates/paired.yaml", file=sys.stderr)
    return 0
