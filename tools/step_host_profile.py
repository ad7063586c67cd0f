"""Where an eager decode step's host time goes: the whole per-rank step over a static cache (the step `qwen36 tune
step` times), at one batch size, with the paths a dispatch table serves or the ones `--paths` forces.

    python3 tools/step_host_profile.py --batch 1 --out runs/step-host
    python3 tools/step_host_profile.py --paths attention_decode_layer=staged,add_norm=fused --out runs/step-host-old

Three figures per step, every step from the same restored state:
- eager: CUDA events around one step after a synchronisation (what `tune step` reports, without the L2 flush);
- host: the host's time to issue one step, no synchronisation inside it (the GPU runs behind it);
- a cProfile of `--profile-steps` steps, by own time, and summed by where the code lives (this repository's
  model package, torch, triton, the rest).
When host is close to eager, the step is launch-bound and host time is what to cut.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from harness.tune.measure.inputs import generator
from model.qwen36 import CapturableDecodeStep, Qwen36Model, Qwen36Paths
from step_path_ab import paths_from, rank_model_weights  # tools/ is the script's own directory


def _where(filename: str, name: str) -> str:
    """Which code a profiled function's own time belongs to."""
    if filename == "~":  # a C function: torch's ops and tensor methods, Triton's compiled launcher, builtins
        for marker, origin in (("triton", "triton launcher (C)"), ("torch", "torch ops (C++)")):
            if marker in name:
                return origin
        return "python builtins"
    for marker, origin in (("/model/", "model (this repository)"), ("/torch/", "torch (python)"),
                           ("/triton/", "triton (python)"), ("/harness/", "harness")):
        if marker in filename:
            return origin
    return "other python"


def own_time_by_origin(stats: pstats.Stats) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        totals[_where(filename, name)] += tottime
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--paths", default="", help="Qwen36Paths fields, field=value,... (default: the served paths)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prefill", type=int, default=256)
    p.add_argument("--steps", type=int, default=30, help="timed steps for the eager and host figures")
    p.add_argument("--profile-steps", type=int, default=20)
    p.add_argument("--dims", choices=("real", "tiny"), default="real")
    p.add_argument("--device", default=None)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    chosen = paths_from(a.paths)
    device, cfg, weights = rank_model_weights(a.dims, a.device)
    model = Qwen36Model(weights, Qwen36Paths(**chosen))
    prompt = torch.randint(0, cfg.vocab_size, (a.batch, a.prefill), generator=generator(device, 91_000 + a.batch),
                           device=device)
    logits, cache = model.forward(prompt)
    step = CapturableDecodeStep.from_prefill(model, cache, cache.length + 1)
    step.ids.copy_(logits[:, -1].argmax(-1, keepdim=True))
    del logits, cache
    saved = step.snapshot()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def one_step() -> None:
        step.restore(saved)
        step.run()

    for _ in range(3):  # compilation, autotuning, launch plans
        one_step()
    eager_ms, host_ms = [], []
    for _ in range(a.steps):
        step.restore(saved)
        sync()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        step.run()
        host_ms.append((time.perf_counter() - t0) * 1e3)
        if device.type == "cuda":
            end.record()
            end.synchronize()
            eager_ms.append(start.elapsed_time(end))
        else:
            eager_ms.append(host_ms[-1])
    sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.profile_steps):
        one_step()
    sync()
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(40)
    by_origin = own_time_by_origin(stats)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "batch": a.batch,
        "paths": chosen, "steps": a.steps,
        "eager_ms_median": statistics.median(eager_ms), "eager_ms": eager_ms,
        "host_ms_median": statistics.median(host_ms), "host_ms": host_ms,
        "profiled_steps": a.profile_steps,
        "profile_own_ms_per_step_by_origin": {k: v * 1e3 / a.profile_steps for k, v in by_origin.items()},
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"step-host-b{a.batch}.json").write_text(json.dumps(result, indent=2) + "\n")
    (a.out / f"step-host-b{a.batch}-profile.txt").write_text(buf.getvalue())
    print(f"B={a.batch}: eager {result['eager_ms_median']:.2f} ms, host issue {result['host_ms_median']:.2f} ms "
          f"per step (median of {a.steps}); profiled own time per step by origin (ms, under cProfile):")
    for origin, ms in result["profile_own_ms_per_step_by_origin"].items():
        print(f"  {origin:28s} {ms:8.2f}")
    print("\n".join(buf.getvalue().splitlines()[:50]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
