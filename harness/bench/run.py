"""`qwen36 bench`: from a typed config to a run directory.

With no base URL it builds the tiny model, starts the embedded vLLM CPU server, measures, and stops it.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

import httpx

from harness.bench import datasets as ds
from harness.bench.artifacts import manifest, new_run_dir, write_json, write_records
from harness.bench.client import API_KEY_FIX, UNAUTHORIZED, ClientConfig
from harness.errors import HarnessError
from harness.machine.hardware import HardwareSampler, summarize_samples
from harness.machine.speed import MachineSpeed, measure_machine_speed, run_speed
from harness.bench.metrics import REGISTRY, RunSummary, Scoring
from harness.paths import RUNS_DIR
from harness.serving.placement import client_on
from harness.machine.prometheus import compare_hit_rates, deltas, scrape
from harness.bench.report import metrics_table, write_plot, write_report
from harness.bench.runner import Point, PointResult, SweepPolicy, run_points, sweep_stop_reason
from harness.serving.launcher import ManagedServer, embedded_server

DATASETS = ("decode-micro", "official-like", "matrix", "replay")


@dataclass(frozen=True)
class Workload:
    dataset: str
    concurrencies: tuple[int, ...]
    requests: int | None = None  # per point; None: the dataset's default
    output_tokens: int | None = None
    input_tokens: tuple[int, ...] = (128,)  # matrix only
    replay_file: Path | None = None
    prompt_cap_tokens: int | None = None  # official-like only; None: the dataset's default


PRESETS: dict[str, tuple[Workload, ...]] = {
    # `make bench`: decode speed at three concurrencies, then a small agentic multi-turn run.
    "quick": (Workload("decode-micro", (1, 2, 4), requests=8, output_tokens=128),
              Workload("official-like", (2,))),
    # The perf gate's workload (`cpu-tiny` profile): decode speed at c=2 and agentic prefix reuse at c=1 (the
    # platform's concurrency), small enough to repeat on two cores. official-like at c=2 was not steady on
    # the tiny server: one request's prefill step stalls the other's decode, and its Output TPS P10 over 8
    # requests swung 56-98 tok/s between repeats of one run (2026-12-01).
    "gate": (Workload("decode-micro", (2,), requests=16, output_tokens=64),
             Workload("official-like", (1,), requests=8)),
    # CI's paired gates' blocks (harness.gates.interleave): short, because on the 2-core CI machines speed moves within
    # seconds and the pair of blocks must see the same machine. Blocks of 8 decode requests of 32 tokens gave pair
    # ratios half as spread as blocks of 16 of 64 (2026-12-03, docs/perf-gates.md); official-like's 4 requests of
    # one session with 8 output tokens measure its prefill (TTFT) and its prefix cache, not its decode.
    "paired": (Workload("decode-micro", (2,), requests=8, output_tokens=32),
               Workload("official-like", (1,), requests=4, output_tokens=8)),
    # The prefix cache's hit rate at the least cost: two turns of one official-like session (about 10K prompt
    # tokens, which a server without a cache prefills in full; the 4 turns of `paired` took 320 s there in the
    # parallel run of 2026-12-03's CI). CI's prefix-caching regression (tests/perf_gates/test_gate_no_cache.py).
    "prefix-cache": (Workload("official-like", (1,), requests=2, output_tokens=8),),
    # The `bi-v100-tp4-245k` profile's workload, as the team's BI-V100 records describe it (docs/design.md):
    # 8 requests at concurrency 1, max_tokens 256, cumulative multi-turn with tools, prompts capped at 40K tokens.
    "bi-v100-ledger": (Workload("official-like", (1,), requests=8, output_tokens=256, prompt_cap_tokens=40000),),
}


@dataclass(frozen=True)
class BenchConfig:
    workloads: tuple[Workload, ...]
    base_url: str | None = None  # None: start the embedded tiny server
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None
    tokenizer: Path | None = None  # tokenizer.json (or its directory) used to size official-like prompts
    seed: int = 0
    repeats: int = 1
    sweep: bool = False
    sweep_policy: SweepPolicy = field(default_factory=SweepPolicy)
    out_root: Path = RUNS_DIR
    label: str = "bench"
    timeout_s: float = 600.0
    show_progress: bool = True
    # A server started elsewhere (base_url given): what it runs, for the manifest, so that runs against it
    # are comparable with runs that started the embedded server themselves.
    server_command: str | None = None
    model_dir: Path | None = None  # its model directory: sizes prompts with its tokenizer, hashes its files
    # A server on this machine: the cores the client runs on while measuring (the layout's frontend cores,
    # harness/serving/placement.py). The embedded server sets it itself; None leaves the client where it is.
    client_cpus: tuple[int, ...] | None = None
    # Stalled streams out of the timing percentiles (harness.bench.metrics.summarize); None: yes when the server
    # is on this machine (loopback), where a stall is the client's, no for a remote server.
    exclude_stalled: bool | None = None
    # Embedded server only.
    tiny_model_dir: Path | None = None  # None: build into <out_root>/tiny-model
    max_model_len: int = 8192
    server_log: Path | None = None
    place_processes: bool = True  # harness/serving/placement.py; False reproduces vLLM's own placement
    # Run harness.machine.speed's probe before and after the workloads, into the manifest: for a server on this
    # machine, whose speed the probe then stands for, so a gate can compare runs made on different days.
    machine_speed: bool = False


def list_models(base_url: str, api_key: str | None) -> list[str]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
        if r.status_code == UNAUTHORIZED:
            raise HarnessError(f"server {base_url}: GET /v1/models answered 401{' to the key given' if api_key else ''}: "
                               f"{API_KEY_FIX}")
        r.raise_for_status()
        return [m["id"] for m in r.json()["data"]]
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise HarnessError(f"server {base_url}: GET /v1/models failed ({exc}); check --base-url "
                           "(scheme, host and port, no /v1 suffix) and that the server is up") from exc


def _token_counter(cfg: BenchConfig, model_dir: Path | None) -> ds.TokenCounter:
    path = cfg.tokenizer or (model_dir / "tokenizer.json" if model_dir else None)
    if path is not None and Path(path).is_dir():
        path = Path(path) / "tokenizer.json"
    return ds.tokenizer_counter(Path(path)) if path else ds.approx_token_count


def build_points(cfg: BenchConfig, count: ds.TokenCounter) -> list[Point]:
    points = []
    for w in cfg.workloads:
        for c in w.concurrencies:
            if w.dataset == "decode-micro":
                d = ds.decode_micro(cfg.seed, requests=w.requests or max(8, 2 * c),
                                    output_tokens=w.output_tokens or 128)
                points.append(Point(f"decode-micro@c{c}", d, c, cfg.repeats))
            elif w.dataset == "official-like":
                kw = {"max_tokens": w.output_tokens} if w.output_tokens else {}
                if w.requests:
                    kw["sessions"] = max(1, -(-w.requests // 4))  # 4 turns per session
                    if w.requests < 4:
                        kw["turns"] = w.requests  # fewer: one session of that many turns
                if w.prompt_cap_tokens:
                    kw["prompt_cap_tokens"] = w.prompt_cap_tokens
                d = ds.official_like(cfg.seed, count=count, **kw)
                points.append(Point(f"official-like@c{c}", d, c, cfg.repeats))
            elif w.dataset == "matrix":
                for n_in in w.input_tokens:
                    n_out = w.output_tokens or 128
                    d = ds.matrix_point(cfg.seed, n_in, n_out, requests=w.requests or 2 * c)
                    points.append(Point(f"matrix@c{c}-i{n_in}-o{n_out}", d, c, cfg.repeats))
            elif w.dataset == "replay":
                if w.replay_file is None:
                    raise HarnessError("dataset replay needs --replay-file FILE.jsonl")
                points.append(Point(f"replay@c{c}", ds.replay(w.replay_file), c, cfg.repeats))
            else:
                raise HarnessError(f"unknown dataset {w.dataset!r}; choose one of {', '.join(DATASETS)}")
    return points


def median_summary(summaries: list[RunSummary]) -> RunSummary:
    """The table's view of repeats: each metric's median over repeats, the rest the last repeat's (every
    repeat is in summary.json)."""
    if len(summaries) == 1:
        return summaries[0]
    medians = {}
    for name in summaries[-1].metrics:
        vals = [s.metrics[name] for s in summaries if s.metrics.get(name) is not None]
        medians[name] = statistics.median(vals) if vals else None
    return replace(summaries[-1], metrics=medians)


def table_json(summaries: list[RunSummary]) -> dict:
    """summary.json's `table` of a point."""
    table = median_summary(summaries).to_json()
    if len(summaries) > 1:  # the median table has always carried the per-request metric names too, as null
        table.update(dict.fromkeys(name for name, m in REGISTRY.items() if m.scope == "request"))
    return table


def run_bench(cfg: BenchConfig) -> Path:
    """Run the workloads; returns the run directory. Prints the metrics table on stdout."""
    run_dir = new_run_dir(cfg.out_root, cfg.label)
    server: ManagedServer | None = None
    model_dir: Path | None = None
    try:
        if cfg.base_url is None:
            server = embedded_server(cfg.out_root, cfg.tiny_model_dir, cfg.server_log or run_dir / "server.log",
                                     max_model_len=cfg.max_model_len, place_processes=cfg.place_processes)
            model_dir = Path(server.cfg.model)
            print(f"starting the embedded vLLM CPU server (about a minute); log {server.log_path}", file=sys.stderr)
            server.start()
            base_url = server.base_url
        else:
            base_url = cfg.base_url.rstrip("/")
            model_dir = cfg.model_dir
        model = cfg.model or list_models(base_url, cfg.api_key)[0]
        points = build_points(cfg, _token_counter(cfg, model_dir))
        client = ClientConfig(base_url, model, cfg.api_key, timeout_s=cfg.timeout_s,
                              stall_timeout_s=min(cfg.timeout_s, 120.0))
        scoring = Scoring.load()
        scrapes: dict[str, dict] = {}
        prev: list[RunSummary] = []

        def before(point: Point) -> None:
            # Before the first repeat's measured phase (later repeats' warm-ups then fall inside the delta).
            if "before" not in scrapes.setdefault(point.name, {}):
                scrapes[point.name]["before"] = scrape(base_url)

        def after(res: PointResult) -> str | None:
            scrapes[res.point.name]["after"] = scrape(base_url)
            if not cfg.sweep or not res.summaries:
                return None
            cur = median_summary(res.summaries)
            alive = server.proc.poll() is None if server else _reachable(base_url, cfg.api_key)
            reason = sweep_stop_reason(prev[-1] if prev else None, cur, cfg.sweep_policy, alive)
            prev.append(cur)
            return reason

        speed_before = _probe() if cfg.machine_speed else None
        client_cpus = server.client_cpus if server else cfg.client_cpus
        with HardwareSampler(run_dir / "hardware.jsonl") as sampler, client_on(client_cpus):
            results, end_reason = run_points(client, points, scoring, show_progress=cfg.show_progress,
                                             before_measure=before, after_point=after,
                                             exclude_stalled=_exclude_stalled(cfg, base_url))
        if end_reason == "completed" and cfg.sweep:
            end_reason = "max_reached"

        speed = None
        if speed_before is not None:  # after the workloads too: the run's speed is the mean of both
            speed_after = None if end_reason == "interrupted" else _probe()
            speed = run_speed(speed_before, speed_after or speed_before)
        write_outputs(run_dir, cfg, base_url, model, server, model_dir, results, end_reason, scrapes, scoring,
                      sampler.tool, speed)
        return run_dir
    finally:
        if server is not None:
            server.stop()
        if not any(run_dir.iterdir()):
            run_dir.rmdir()  # failed before anything was written: leave no empty run directory


def _probe() -> MachineSpeed | None:
    """The machine's speed probe, or None with a warning: a probe that fails costs the run its rescaling, never
    its records."""
    try:
        return measure_machine_speed()
    except (subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
        print(f"warning: the machine speed probe failed ({exc}); this run cannot be rescaled to a baseline's day",
              file=sys.stderr)
        return None


def _exclude_stalled(cfg: BenchConfig, base_url: str) -> bool:
    return cfg.exclude_stalled if cfg.exclude_stalled is not None else on_this_machine(base_url)


def on_this_machine(base_url: str) -> bool:
    """A loopback URL: the server shares this machine with the client."""
    host = urlparse(base_url).hostname or ""
    return host == "localhost" or host == "::1" or host.startswith("127.")


def _reachable(base_url: str, api_key: str | None) -> bool:
    """Alive = answers HTTP at all (even 4xx); a refused or silent connection means it crashed."""
    try:
        httpx.get(base_url + "/v1/models", timeout=30)
        return True
    except httpx.TransportError:
        return False


def write_outputs(run_dir: Path, cfg: BenchConfig, base_url: str, model: str, server: ManagedServer | None,
                  model_dir: Path | None, results: list[PointResult], end_reason: str, scrapes: dict,
                  scoring: Scoring, sampler_tool: str | None, machine_speed: dict | None = None,
                  quiet: bool = False) -> None:
    """manifest.json, requests.jsonl, summary.json, report.md and plot.png; the metrics table on stdout unless
    `quiet`."""
    man = manifest(base_url=base_url, model=model,
                   server_command=server.command_line if server else cfg.server_command,
                   datasets=[r.point.dataset for r in results], seeds={"dataset": cfg.seed},
                   extra={"points": [{"name": r.point.name, "concurrency": r.point.concurrency,
                                      "repeats": r.point.repeats, "dataset": r.point.dataset.name}
                                     for r in results],
                          "end_reason": end_reason, "hardware_sampler": sampler_tool,
                          "placement": ({"layout": server.layout.describe()} if server and server.layout else
                                        {"client_cpus": list(cfg.client_cpus)} if cfg.client_cpus else None),
                          "machine_speed": machine_speed})
    if model_dir is not None:
        from harness.serving.tiny_model import checkpoint_digest

        man["model_files_sha256"] = checkpoint_digest(Path(model_dir))
    write_json(run_dir / "manifest.json", man)
    write_records(run_dir / "requests.jsonl", [rec for r in results for rec in r.records])
    table_points = [(r.point.name, median_summary(r.summaries)) for r in results if r.summaries]
    server_view = {}
    for r in results:
        s = scrapes.get(r.point.name, {})
        d = deltas(s.get("before"), s.get("after"))
        if d is not None and r.summaries:
            usage_rate = median_summary(r.summaries).get("cache_hit_rate")
            server_view[r.point.name] = {"deltas": d, "usage_hit_rate": usage_rate,
                                         "disagreement": compare_hit_rates(d["server_prefix_cache_hit_rate"],
                                                                           usage_rate)}
    hardware = summarize_samples(run_dir / "hardware.jsonl")
    write_json(run_dir / "summary.json", {
        "end_reason": end_reason,
        "points": {r.point.name: {"concurrency": r.point.concurrency, "repeats": [s.to_json() for s in r.summaries],
                                  "table": table_json(r.summaries) if r.summaries else None,
                                  "interrupted": r.interrupted} for r in results},
        "server_view": server_view or None,
        "hardware": hardware,
    })
    notes = []
    if server is not None and server.proc is not None and server.proc.poll() is not None:
        from harness.serving.launcher import log_tail

        notes.append(f"the embedded server exited with code {server.proc.returncode} during the run; "
                     f"last log lines:\n\n```\n{log_tail(server.log_path, 20)}\n```")
    if end_reason == "interrupted":
        notes.append("interrupted with Ctrl-C: the figures cover the requests completed before it")
    write_report(run_dir / "report.md", title=f"Benchmark run {run_dir.name}", manifest=man, points=table_points,
                 scoring=scoring, end_reason=end_reason, server_view=server_view or None, hardware=hardware,
                 notes=notes)
    write_plot(run_dir / "plot.png", [(r.point.name, r.records) for r in results])
    if not quiet:
        print(metrics_table(table_points, scoring))
        print(f"\nrun ended: {end_reason}; run directory: {run_dir}")
