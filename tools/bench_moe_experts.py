"""Time the routed-expert paths at the real per-rank dims on one CUDA GPU, next to the HBM and compute floors.

    PYTHONPATH=. python3 tools/bench_moe_experts.py --out DIR [--tokens 1,2,4] [--no-sweep]

Dims: hidden 2048, 256 experts, top-8, expert intermediate 128 (Qwen3.6-35B-A3B at TP=4), bfloat16.
Method (every figure is measured here):
- before every timed call a 512 MB buffer is overwritten (L2 is 60 MB), then the device is synchronised, so a
  call starts on a cold L2 and an idle GPU: eager times include the host's launch overhead;
- eager: CUDA events around the call; graph: the call captured once in a CUDA graph, events around replay;
- each (path, T, mode) is timed in two rounds of up to `--samples` calls (a round stops after 1 s, with at
  least 5 calls),
  reported as the median of each round and p10..p90 over both;
- every path's output is checked against the float64 reference (relative Frobenius error), and a graph
  replay against the eager output;
- the Triton paths' block configs are swept first (graph replay, same flushing); the table uses the fastest
  config per T, and the run prints the tables to paste into model/moe/triton_*.py. With --no-sweep the
  table uses the registered per-T configs (DECODE_CONFIGS, GROUPED_CONFIGS) as they are.
Floors: HBM = (distinct experts' weights touched + x + out + routing) / 4.3 TB/s; compute = 6*T*k*H*I FLOP /
790 TFLOP/s (the rates measured on the H200s this project was lent; this run also measures a copy and a GEMM).
Writes DIR/moe_triton_bench.json and DIR/moe_triton_bench.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.moe.experts import EXPERT_PATHS, experts_reference  # noqa: E402
from model.moe.router import route_reference  # noqa: E402
from model.moe.triton_decode import DecodeConfig, decode_config, experts_triton_decode  # noqa: E402
from model.moe.triton_grouped import GroupedConfig, experts_triton_grouped, grouped_config  # noqa: E402

HIDDEN, EXPERTS, TOP_K, INTER = 2048, 256, 8, 128
DTYPE = torch.bfloat16
HBM_BYTES_PER_S = 4.3e12
BF16_FLOP_PER_S = 790e12
TOKENS = (1, 2, 4, 8, 16, 32, 64, 512, 4096, 8192)
BASELINES = ("decode_fused", "tiny_bmm", "sorted", "grouped_mm")
BF16_BOUND = 1.5e-2  # model/tolerances.py, the bf16 bound of every path

# The registered defaults are among the candidates, so the sweep always shows them too.
DECODE_CANDIDATES = list(dict.fromkeys(
    [DecodeConfig(block_i=bi, block_h=bh, warps_gate_up=wg, block_n=bn, warps_down=wd)
     for bi, bh, wg in ((2, 1024, 4), (2, 2048, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 8))
     for bn, wd in ((4, 2), (8, 2), (8, 4), (16, 4), (16, 8))]
    + [DecodeConfig()]
))


def _grouped(block_ms, gate_ups, downs):
    return [GroupedConfig(block_m=bm, gate_up_n=gn, gate_up_k=gk, gate_up_warps=gw, gate_up_stages=gs,
                          down_n=dn, down_k=dk, down_warps=dw, down_stages=ds)
            for bm in block_ms for gn, gk, gw, gs in gate_ups for dn, dk, dw, ds in downs]


# Few rows per expert below 512 tokens: small row blocks only. Above, the tile shapes that matter.
GROUPED_SMALL_T = _grouped((16, 32), ((64, 64, 4, 4), (128, 64, 4, 3), (64, 128, 4, 3)),
                           ((64, 128, 4, 2), (128, 64, 4, 2), (256, 64, 8, 2)))
GROUPED_LARGE_T = list(dict.fromkeys(_grouped(
    (32, 64, 128),
    ((64, 64, 4, 4), (128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 128, 4, 3), (64, 64, 8, 5)),
    ((128, 64, 4, 2), (128, 128, 4, 2), (256, 64, 8, 2), (128, 64, 8, 3), (256, 128, 8, 2)),
) + [GroupedConfig()]))
GROUPED_CANDIDATES = list(dict.fromkeys(GROUPED_SMALL_T + GROUPED_LARGE_T))
LARGE_T = 512


@triton.jit
def _empty_kernel_1(p0):
    pass


@triton.jit
def _empty_kernel_16(p0, p1, p2, p3, p4, p5, p6, p7, a0, a1, a2, a3, a4, a5, a6, a7):
    pass


# --- inputs, floors, timing ------------------------------------------------------------------------------

def make_weights(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w13 = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g, device="cuda") / HIDDEN**0.5).to(DTYPE)
    w2 = (torch.randn(EXPERTS, HIDDEN, INTER, generator=g, device="cuda") / INTER**0.5).to(DTYPE)
    return w13, w2


def make_inputs(tokens, seed):
    g = torch.Generator(device="cuda").manual_seed(1000 + seed)
    x = torch.randn(tokens, HIDDEN, generator=g, device="cuda").to(DTYPE)
    weights, ids = route_reference(torch.randn(tokens, EXPERTS, generator=g, device="cuda") * 4, TOP_K)
    return x, weights, ids


def floors_us(ids):
    tokens = ids.shape[0]
    distinct = int(ids.unique().numel())
    weight_bytes = distinct * 3 * INTER * HIDDEN * DTYPE.itemsize
    act_bytes = 2 * tokens * HIDDEN * DTYPE.itemsize + tokens * TOP_K * (8 + 4)
    hbm = (weight_bytes + act_bytes) / HBM_BYTES_PER_S * 1e6
    compute = 6 * tokens * TOP_K * HIDDEN * INTER / BF16_FLOP_PER_S * 1e6
    return {"distinct_experts": distinct, "bytes": weight_bytes + act_bytes, "hbm_us": hbm, "compute_us": compute,
            "floor_us": max(hbm, compute)}


class Flusher:
    """Overwrites 512 MB (eight times the L2) so the next call reads its weights from HBM."""

    def __init__(self):
        self.buf = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")

    def __call__(self):
        self.buf.fill_(1)
        torch.cuda.synchronize()


def capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_us(run, flush, max_samples, max_seconds):
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    samples = []
    deadline = time.perf_counter() + max_seconds
    while len(samples) < max_samples and (len(samples) < 5 or time.perf_counter() < deadline):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return samples


def summary(samples):
    q = statistics.quantiles(samples, n=10) if len(samples) >= 2 else [samples[0]] * 9
    return {"median_us": statistics.median(samples), "p10_us": q[0], "p90_us": q[-1], "min_us": min(samples),
            "n": len(samples)}


def rel_error(out, ref):
    out64 = out.double()
    if not torch.isfinite(out64).all():
        return float("inf")
    return ((out64 - ref).norm() / ref.norm()).item()


# --- ceilings --------------------------------------------------------------------------------------------

def measure_ceilings():
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, device="cuda").to(DTYPE)
    b = torch.randn(8192, 8192, device="cuda").to(DTYPE)

    def timed(fn, reps=10):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    copy_s = timed(lambda: dst.copy_(src))
    gemm_s = timed(lambda: a @ b)
    return {"copy_bytes_per_s": 2 * src.numel() / copy_s, "bf16_gemm_flop_per_s": 2 * 8192**3 / gemm_s}


def launch_probe(w13, w2):
    """Host time per launch (no synchronisation, so the device never waits): what an eager call pays before
    its kernels can run. Median of 5 batches of 200 calls."""
    x1 = torch.zeros(16, device="cuda")
    xs, weights, ids = make_inputs(1, seed=1)
    out = torch.empty_like(xs)
    probes = {
        "torch x.add_(1)": lambda: x1.add_(1),
        "torch.empty(1024) (no launch)": lambda: torch.empty(1024, device="cuda"),
        "triton empty kernel, 1 arg": lambda: _empty_kernel_1[(1,)](x1),
        "triton empty kernel, 8 tensors + 8 ints": lambda: _empty_kernel_16[(1,)](*([x1] * 8), *range(8)),
        "triton_decode call, T=1": lambda: EXPERT_PATHS["triton_decode"].fn(xs, w13, w2, weights, ids, out),
        "triton_grouped call, T=1": lambda: EXPERT_PATHS["triton_grouped"].fn(xs, w13, w2, weights, ids, out),
        "decode_fused call, T=1": lambda: EXPERT_PATHS["decode_fused"].fn(xs, w13, w2, weights, ids, out),
    }
    result = {}
    for name, fn in probes.items():
        fn()
        torch.cuda.synchronize()
        batches = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(200):
                fn()
            batches.append((time.perf_counter() - start) / 200 * 1e6)
            torch.cuda.synchronize()
        result[name] = statistics.median(batches)
    return result


# --- parallel compilation of the sweep's configs --------------------------------------------------------

def _warm_worker(kind_and_configs):
    """Runs each config once at T=64 in its own process: the compiled kernels land in Triton's disk cache,
    which the main process then reads instead of compiling the configs one after another."""
    kind, configs = kind_and_configs
    w13, w2 = make_weights()
    x, weights, ids = make_inputs(64, 0)
    out = torch.empty_like(x)
    fn = experts_triton_decode if kind == "decode" else experts_triton_grouped
    failed = []
    for cfg in configs:
        try:
            fn(x, w13, w2, weights, ids, out, config=cfg)
        except Exception as exc:  # e.g. a tile that needs more shared memory than the SM has
            failed.append((dataclasses.asdict(cfg), repr(exc)[:200]))
    torch.cuda.synchronize()
    return failed


def _chunks(items, n):
    size = -(-len(items) // n)
    return [items[i : i + size] for i in range(0, len(items), size)]


def precompile(workers=8):
    # Contiguous chunks of the candidate lists, which vary the down kernel fastest: configs that share a
    # gate-up kernel land in one worker, so it is compiled once.
    jobs = [("decode", c) for c in _chunks(DECODE_CANDIDATES, workers)]
    jobs += [("grouped", c) for c in _chunks(GROUPED_CANDIDATES, workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        return [f for failed in pool.map(_warm_worker, jobs) for f in failed]


# --- the measurements ------------------------------------------------------------------------------------

def sweep(kind, candidates_for, tokens_list, w13, w2, flush, log):
    fn = experts_triton_decode if kind == "decode" else experts_triton_grouped
    results = {}
    for tokens in tokens_list:
        candidates = candidates_for(tokens)
        x, weights, ids = make_inputs(tokens, seed=tokens)
        ref = experts_reference(x, w13, w2, weights, ids, torch.empty(x.shape, dtype=torch.float64, device="cuda"))
        rows = []
        for cfg in candidates:
            out = torch.full_like(x, float("nan"))
            call = lambda cfg=cfg, out=out: fn(x, w13, w2, weights, ids, out, config=cfg)  # noqa: E731
            try:
                call()
                err = rel_error(out, ref)
                graph = capture(call)
            except Exception as exc:
                rows.append({"config": dataclasses.asdict(cfg), "error": repr(exc)[:200]})
                continue
            stats = summary(time_us(graph.replay, flush, 12, 0.5))
            rows.append({"config": dataclasses.asdict(cfg), "rel_error": err, **stats})
            del graph
        ok = [r for r in rows if "median_us" in r and r["rel_error"] <= BF16_BOUND]
        best = min(ok, key=lambda r: r["median_us"]) if ok else None
        results[tokens] = {"rows": rows, "best": best}
        log(f"sweep {kind} T={tokens}: best {best['median_us']:.1f} us {best['config']}" if best else f"sweep {kind} T={tokens}: none")
        torch.cuda.empty_cache()
    return results


def path_fns(tokens, chosen):
    """name -> fn(x, w13, w2, weights, ids, out) for every path measured at this T."""
    fns = {}
    for name in BASELINES:
        path = EXPERT_PATHS[name]
        if not path.supports(tokens, DTYPE, "cuda") or (name == "tiny_bmm" and tokens > 64):
            continue  # tiny_bmm gathers T*k weight matrices: past 64 tokens it runs out of memory
        fns[name] = path.fn
    if tokens in chosen.get("decode", {}):
        cfg = chosen["decode"][tokens]
        fns["triton_decode"] = lambda *a, cfg=cfg: experts_triton_decode(*a, config=cfg)
    if tokens in chosen.get("grouped", {}):
        cfg = chosen["grouped"][tokens]
        fns["triton_grouped"] = lambda *a, cfg=cfg: experts_triton_grouped(*a, config=cfg)
    return fns


CAPTURABLE = ("decode_fused", "tiny_bmm", "triton_decode", "triton_grouped")


def measure_table(tokens_list, chosen, w13, w2, flush, samples, log):
    rows = []
    floors = {}
    for tokens in tokens_list:
        x, weights, ids = make_inputs(tokens, seed=tokens)
        floors[tokens] = floors_us(ids)
        ref = experts_reference(x, w13, w2, weights, ids, torch.empty(x.shape, dtype=torch.float64, device="cuda"))
        for name, fn in path_fns(tokens, chosen).items():
            out = torch.full_like(x, float("nan"))
            call = lambda fn=fn, out=out: fn(x, w13, w2, weights, ids, out)  # noqa: E731
            call()
            torch.cuda.synchronize()
            err = rel_error(out, ref)
            eager_out = out.clone()
            modes = {"eager": call}
            graph_equal = None
            if name in CAPTURABLE:
                graph = capture(call)
                out.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                graph_equal = bool(torch.equal(out, eager_out))
                modes["graph"] = graph.replay
            for mode, run in modes.items():
                rounds = [time_us(run, flush, samples, 1.0) for _ in range(2)]
                stats = summary(rounds[0] + rounds[1])
                stats["round_medians_us"] = [statistics.median(r) for r in rounds]
                stats["multiple_of_floor"] = stats["median_us"] / floors[tokens]["floor_us"]
                rows.append({"path": name, "tokens": tokens, "mode": mode, "rel_error": err,
                             "graph_equals_eager": graph_equal, **stats})
                log(f"T={tokens:5d} {name:15s} {mode:5s} {stats['median_us']:10.1f} us "
                    f"({stats['multiple_of_floor']:.2f}x floor) err {err:.2e}")
            modes.clear()
            torch.cuda.empty_cache()
    return rows, floors


def capture_attempts(w13, w2):
    """Whether the torch paths outside CAPTURABLE can be captured (each tried once, after everything else)."""
    x, weights, ids = make_inputs(8, seed=8)
    result = {}
    for name in ("sorted", "grouped_mm"):
        out = torch.empty_like(x)
        try:
            capture(lambda: EXPERT_PATHS[name].fn(x, w13, w2, weights, ids, out))
            result[name] = "captured"
        except Exception as exc:
            result[name] = f"not capturable: {repr(exc)[:300]}"
        torch.cuda.synchronize()
    return result


# --- report ----------------------------------------------------------------------------------------------

def config_table(name, chosen):
    lines = [f"{name} = ("]
    for tokens, cfg in sorted(chosen.items()):
        lines.append(f"    ({tokens}, {cfg!r}),")
    return "\n".join(lines + [")"])


def markdown(report):
    lines = [f"# Routed-expert paths on {report['device']} (torch {report['torch']}, triton {report['triton']})", ""]
    c = report["ceilings_measured"]
    lines.append(f"Measured here: device copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write), bf16 GEMM "
                 f"8192^3 {c['bf16_gemm_flop_per_s'] / 1e12:.0f} TFLOP/s. Floors use 4.3 TB/s and 790 TFLOP/s.")
    lines.append("")
    lines.append("Host time per call, no synchronisation (what eager pays before the kernels run): "
                 + "; ".join(f"{k} {v:.1f} us" for k, v in report.get("host_us_per_call", {}).items()))
    lines.append("")
    lines.append("Median us over two rounds (each round's median in brackets), x = multiple of the floor; "
                 "L2 flushed before every call; eager includes host launch overhead.")
    lines.append("")
    paths = [p for p in BASELINES + ("triton_decode", "triton_grouped") if any(r["path"] == p for r in report["table"])]
    header = "| T | distinct experts | HBM floor us | compute floor us | " + " | ".join(f"{p} eager | {p} graph" for p in paths) + " |"
    lines += [header, "|" + "---:|" * (4 + 2 * len(paths))]
    by_key = {(r["path"], r["tokens"], r["mode"]): r for r in report["table"]}
    for tokens in report["tokens"]:
        f = report["floors"][str(tokens)]
        cells = [str(tokens), str(f["distinct_experts"]), f"{f['hbm_us']:.1f}", f"{f['compute_us']:.1f}"]
        for p in paths:
            for mode in ("eager", "graph"):
                r = by_key.get((p, tokens, mode))
                if r is None:
                    cells.append("n/c" if mode == "graph" and (p, tokens, "eager") in by_key else "-")
                else:
                    a, b = r["round_medians_us"]
                    cells.append(f"{r['median_us']:.1f} [{a:.1f}/{b:.1f}] {r['multiple_of_floor']:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "n/c: not capturable (see capture_attempts); -: not run at this T.", ""]
    lines.append("Relative error against the float64 reference, and graph replay == eager (bitwise):")
    lines.append("")
    lines.append("| path | T | rel error | graph == eager |")
    lines.append("|---|---:|---:|---|")
    for r in report["table"]:
        if r["mode"] == "eager":
            lines.append(f"| {r['path']} | {r['tokens']} | {r['rel_error']:.2e} | {r['graph_equals_eager']} |")
    lines += ["", "Capture attempts: " + json.dumps(report["capture_attempts"]), ""]
    lines += ["Chosen configs:", "", "```python", report["decode_table"], report["grouped_table"], "```", ""]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--no-sweep", action="store_true", help="time the registered per-T configs, no sweep")
    args = parser.parse_args(argv)
    tokens_list = [int(t) for t in args.tokens.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = open(args.out / "moe_triton_bench.log", "w")

    def log(msg):
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    t0 = time.perf_counter()
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
              "dims": {"hidden": HIDDEN, "experts": EXPERTS, "top_k": TOP_K, "intermediate": INTER, "dtype": "bfloat16"},
              "tokens": tokens_list, "ceilings_assumed": {"hbm_bytes_per_s": HBM_BYTES_PER_S, "bf16_flop_per_s": BF16_FLOP_PER_S}}
    report["ceilings_measured"] = measure_ceilings()
    log(f"ceilings {report['ceilings_measured']}")
    w13, w2 = make_weights()
    report["host_us_per_call"] = launch_probe(w13, w2)
    log(f"host us per call {report['host_us_per_call']}")
    flush = Flusher()
    decode_tokens = [t for t in tokens_list if EXPERT_PATHS["triton_decode"].supports(t, DTYPE, "cuda")]
    if args.no_sweep:
        chosen = {"decode": {t: decode_config(t) for t in decode_tokens}, "grouped": {t: grouped_config(t) for t in tokens_list}}
        report["sweep"] = None
    else:
        report["precompile_failures"] = precompile()
        log(f"precompiled in {time.perf_counter() - t0:.0f} s; failures: {len(report['precompile_failures'])}")
        sweeps = {
            "decode": sweep("decode", lambda t: DECODE_CANDIDATES, decode_tokens, w13, w2, flush, log),
            "grouped": sweep("grouped", lambda t: GROUPED_LARGE_T if t >= LARGE_T else GROUPED_SMALL_T,
                             tokens_list, w13, w2, flush, log),
        }
        report["sweep"] = {k: {str(t): v for t, v in s.items()} for k, s in sweeps.items()}
        kinds = {"decode": DecodeConfig, "grouped": GroupedConfig}
        chosen = {k: {t: kinds[k](**v["best"]["config"]) for t, v in s.items() if v["best"]} for k, s in sweeps.items()}
        (args.out / "moe_triton_bench.json").write_text(json.dumps(report, indent=1, default=str))
        log(f"swept in {time.perf_counter() - t0:.0f} s")
    report["decode_table"] = config_table("DECODE_CONFIGS", chosen["decode"])
    report["grouped_table"] = config_table("GROUPED_CONFIGS", chosen["grouped"])
    report["table"], floors = measure_table(tokens_list, chosen, w13, w2, flush, args.samples, log)
    report["floors"] = {str(t): f for t, f in floors.items()}
    report["capture_attempts"] = {"sorted": "not tried yet", "grouped_mm": "not tried yet"}

    def write():
        report["seconds"] = time.perf_counter() - t0
        (args.out / "moe_triton_bench.json").write_text(json.dumps(report, indent=1, default=str))
        (args.out / "moe_triton_bench.md").write_text(markdown(report))

    write()  # before the capture attempts, in case a failed capture takes the process down
    report["capture_attempts"] = capture_attempts(w13, w2)
    write()
    log(markdown(report))


if __name__ == "__main__":
    main()
