"""The two ceilings of harness/tune/measure/ceilings.py, measured on this CUDA device: HBM bandwidth as a large
device-to-device copy (bytes read + written per second) and the dense bf16 matrix rate as an 8192^3 product.

    python3 tools/ceilings_probe.py [--copy-gib 4] [--gemm 8192] [--reps 20] [--out ceilings.json]

Each figure is the median of --reps CUDA-event timings after 3 warm-up calls, with the min and max beside it;
the entry to add to CEILINGS uses the medians. The copy is far larger than L2 (50-60 MB), so it streams HBM.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch


def timed_ms(fn, reps: int) -> list[float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def copy_ms(elements: int, reps: int) -> list[float]:
    src = torch.empty(elements, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    return timed_ms(lambda: dst.copy_(src), reps)


def gemm_ms(size: int, reps: int) -> list[float]:
    x = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    return timed_ms(lambda: x @ y, reps)


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copy-gib", type=float, default=4.0, help="size of the copied buffer (GiB)")
    p.add_argument("--gemm", type=int, default=8192, help="M = N = K of the bf16 product")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("ceilings_probe: no CUDA device: run it on the GPU whose ceilings you want", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    n = int(a.copy_gib * 2**30) // 2
    moved = 2 * n * 2  # bytes read + bytes written
    copy_tbps = [moved / (ms * 1e-3) / 1e12 for ms in copy_ms(n, a.reps)]
    size = a.gemm
    gemm_tflops = [2 * size**3 / (ms * 1e-3) / 1e12 for ms in gemm_ms(size, a.reps)]
    result = {"device": name, "torch": torch.__version__,
              "copy": {"bytes_read_plus_written": moved, "tbps": summary(copy_tbps)},
              "gemm": {"mnk": size, "dtype": "bfloat16", "tflops": summary(gemm_tflops)}}
    c, g = result["copy"]["tbps"], result["gemm"]["tflops"]
    print(f"{name}: copy {c['median']:.2f} TB/s (min {c['min']:.2f}, max {c['max']:.2f}, {c['n']} reps); "
          f"bf16 {size}^3 GEMM {g['median']:.0f} TFLOP/s (min {g['min']:.0f}, max {g['max']:.0f})")
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
