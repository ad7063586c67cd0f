"""Where an eager decode block's host time goes, on CUDA at the real per-rank dims: host-bound wall time per call
of single launches (a torch op, the router GEMM, Triton launches with few and many arguments, through the JIT
front door and straight into the compiled kernel) and of the fused blocks, then a cProfile of each fused block.

    python3 tools/launch_cost_probe.py [--out DIR]

Every figure is back-to-back calls synchronised only around the loop, so a host-bound call reads its host time.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from harness.tune.measure.dims import REAL_PER_RANK
from harness.tune.measure.inputs import gdn_weights, moe_weights
from model.gdn import GDNState, run_decode_layer
from model.moe import moe_block


@triton.jit
def _copy_few(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _copy_many(src, dst, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20,
               n, BLOCK: tl.constexpr, FLAG: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def per_call_us(fn, calls: int = 400, warmup: int = 20, repeats: int = 5) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - start) / calls * 1e6)
    return out


def direct(kernel_fn, grid, *args, **meta):
    """The compiled kernel behind kernel_fn[grid](*args, **meta), and a closure launching it without the JIT's
    binding (None when this Triton's launcher does not take the call)."""
    compiled = kernel_fn[grid](*args, **meta)
    dev = torch.cuda.current_device()
    bound = list(args) + [v for k, v in meta.items() if k not in ("num_warps", "num_stages")]
    g = tuple(grid) + (1,) * (3 - len(grid))

    def launch():
        compiled.run(g[0], g[1], g[2], torch.cuda.current_stream(dev).cuda_stream, compiled.function,
                     compiled.packed_metadata, None, None, None, *bound)
    try:
        launch()
        torch.cuda.synchronize()
        return launch
    except Exception as e:  # noqa: BLE001 - a probe reports what it met
        print(f"direct launch refused: {type(e).__name__}: {e}", flush=True)
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("launch-cost"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dev, dt = torch.device("cuda"), torch.bfloat16
    src = torch.randn(1024, device=dev)
    dst = torch.empty_like(src)
    x1 = torch.randn(1, 2048, device=dev).to(dt)
    mw = moe_weights(REAL_PER_RANK.moe, dt, dev)
    gw = gdn_weights(REAL_PER_RANK.gdn, dt, dev)
    d = REAL_PER_RANK.gdn
    st = GDNState(conv=torch.randn(1, d.conv_dim, d.conv_kernel - 1, device=dev).to(dt),
                  recurrent=torch.randn(1, d.num_v_heads, d.head_k_dim, d.head_v_dim, device=dev))
    out_st = GDNState(conv=torch.empty_like(st.conv), recurrent=torch.empty_like(st.recurrent))
    many = (src, dst, *range(1, 21), 1000)
    cases = {
        "torch.empty(1)": lambda: torch.empty(1, device=dev),
        "torch.add (small)": lambda: torch.add(src, src),
        "F.linear router T=1": lambda: F.linear(x1, mw.router),
        "triton 4 args (jit)": lambda: _copy_few[(1,)](src, dst, 1000, BLOCK=1024),
        "triton 25 args (jit)": lambda: _copy_many[(1,)](*many, BLOCK=1024, FLAG=True),
    }
    few_direct = direct(_copy_few, (1,), src, dst, 1000, BLOCK=1024)
    many_direct = direct(_copy_many, (1,), *many, BLOCK=1024, FLAG=True)
    if few_direct:
        cases["triton 4 args (compiled.run)"] = few_direct
    if many_direct:
        cases["triton 25 args (compiled.run)"] = many_direct
    cases["moe_block triton_fused_block T=1"] = lambda: moe_block(x1, mw, block="triton_fused_block")
    cases["moe_block composed T=1"] = lambda: moe_block(x1, mw, block="composed")
    cases["gdn decode layer triton B=1"] = lambda: run_decode_layer("triton", x1[:, None], gw, st, out_st)
    results = {}
    for name, fn in cases.items():
        reps = per_call_us(fn)
        results[name] = reps
        print(f"{name:40s} median {sorted(reps)[len(reps) // 2]:8.1f} us  (min {min(reps):.1f}, max {max(reps):.1f})",
              flush=True)
    (args.out / "launch_cost.json").write_text(json.dumps(results, indent=1))
    for name, fn in (("moe_fused_block", cases["moe_block triton_fused_block T=1"]),
                     ("gdn_decode_layer", cases["gdn decode layer triton B=1"])):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            fn()
        torch.cuda.synchronize()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        (args.out / f"profile_{name}.txt").write_text(buf.getvalue())
        print(f"--- {name}: cProfile of 300 calls, top by tottime ---\n" + "\n".join(buf.getvalue().splitlines()[:45]),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
