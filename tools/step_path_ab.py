"""Interleaved A/B of two path choices on the whole per-rank decode step, in one process (issue 28).

`qwen36 tune step --router ... --norm ...` run as separate processes drifted by 30% between runs of one
setting on the H200 host (reports/decode-step-2026-12-04.md), more than the effect sought. Here both models
share one set of random weights and one prefill; rounds alternate which side goes first, and each round times a
median of `--reps` eager steps per side (harness.tune.measure.timing.time_eager: L2 flushed, CUDA events). The per-round
ratio B/A is what the verdict rests on. Writes a JSON of every round, and each side's first logits' relative
difference from the other (the two sides compute one step).

`--cache static` (the default) times the step `qwen36 tune step` times and a captured graph replays: over a
StaticDecodeCache, every sample from the same restored state, so the full-attention layer's one-token path
(`attention_decode_layer`) applies. `--cache dynamic` times `forward(ids, cache)` over the prefill's dynamic
cache, which never takes that path.

    python3 tools/step_path_ab.py --b router=triton_fused,norm=triton --batches 1,8 --rounds 12 --out ab.json

`--a` and `--b` take `field=value` pairs of model.qwen36's Qwen36Paths (router, norm, add_norm, moe_block,
gdn_decode_layer, attention_decode_layer, ...); a field not given keeps Qwen36Paths' default (the serving choice).
The few-launch step against the one before the attention layer and the norms had theirs:

    python3 tools/step_path_ab.py --a attention_decode_layer=staged,add_norm=fused \
        --b attention_decode_layer=triton,add_norm=triton --batches 1,8,64 --rounds 6 --reps 10
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import fields
from pathlib import Path

import torch

from harness.tune.measure.inputs import generator, rank_config, rank_weights
from harness.tune.measure.timing import L2Flusher, time_eager, warm_device
from harness.tune.step.graph import RestoringFlusher, relative_difference
from harness.tune.step.run import QWEN36_35B_A3B, TINY_MODEL
from model.qwen36 import CapturableDecodeStep, Qwen36Cache, Qwen36Config, Qwen36Model, Qwen36Paths, Qwen36Weights


def paths_from(spec: str) -> dict[str, str]:
    """"router=triton_fused,norm=triton" -> Qwen36Paths keyword arguments (string-valued fields only)."""
    known = {f.name for f in fields(Qwen36Paths) if f.name != "moe"}
    out = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name not in known:
            raise SystemExit(f"step_path_ab: {item!r} is not field=value with a field of {sorted(known)}")
        out[name] = value
    return out


def rank_model_weights(dims: str, device: str | None) -> tuple[torch.device, Qwen36Config, Qwen36Weights]:
    """(device, config, random weights) of one rank at TP=4 of the real model or the tiny one: bf16 on CUDA (the
    default device when there is one), float32 on a CPU."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = rank_config(Qwen36Config.from_hf_dict(QWEN36_35B_A3B if dims == "real" else TINY_MODEL), 4)
    return device, cfg, rank_weights(cfg, dtype, device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", default="", help="side A's Qwen36Paths fields, field=value,... (default: the defaults)")
    p.add_argument("--b", default="router=triton_fused,norm=triton", help="side B's, the same way")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prefill", type=int, default=256)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--dims", choices=("real", "tiny"), default="real")
    p.add_argument("--cache", choices=("static", "dynamic"), default="static",
                   help="static: the capturable step over a static cache (default); dynamic: forward over the prefill's")
    p.add_argument("--device", default=None)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    choices = {"a": paths_from(a.a), "b": paths_from(a.b)}  # before building weights: a typo fails at once
    device, cfg, weights = rank_model_weights(a.dims, a.device)
    models = {side: Qwen36Model(weights, Qwen36Paths(**fields)) for side, fields in choices.items()}
    flusher = L2Flusher(device, 256 * 2**20)
    warm_device(device)
    result = {"a": choices["a"], "b": choices["b"], "cache": a.cache,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "reps": a.reps, "rounds": a.rounds, "batches": {}}
    for batch in (int(x) for x in a.batches.split(",")):
        prompt = torch.randint(0, cfg.vocab_size, (batch, a.prefill), generator=generator(device, 90_000 + batch),
                               device=device)
        logits, cache = models["a"].forward(prompt)
        ids = logits[:, -1].argmax(-1, keepdim=True)
        del logits
        steps = {side: step_of(models[side], cache, ids, a.cache, device, flusher) for side in models}
        first = {side: step.first_logits for side, step in steps.items()}
        rounds = []
        for r in range(a.rounds):
            order = ("a", "b") if r % 2 == 0 else ("b", "a")
            ms = {side: steps[side].time(a.reps).median_us / 1e3 for side in order}
            rounds.append({"order": "".join(order), **ms, "ratio": ms["b"] / ms["a"]})
            print(f"B={batch} round {r}: a {ms['a']:.2f} ms, b {ms['b']:.2f} ms, b/a {ms['b'] / ms['a']:.3f}",
                  file=sys.stderr)
        ratios = sorted(x["ratio"] for x in rounds)
        result["batches"][batch] = {"rounds": rounds, "median_ratio": statistics.median(ratios),
                                    "ratio_min": ratios[0], "ratio_max": ratios[-1],
                                    "b_faster_rounds": sum(x < 1 for x in ratios),
                                    "b_vs_a_logits_rel_diff": relative_difference(first["b"], first["a"])}
        print(f"B={batch}: b/a median {statistics.median(ratios):.3f} (min {ratios[0]:.3f}, max {ratios[-1]:.3f}); "
              f"b faster in {sum(x < 1 for x in ratios)} of {len(ratios)} rounds")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


class TimedStep:
    """One side's decode step after the shared prefill, timed from the same state every sample."""

    def __init__(self, run, rewind, device: torch.device, warmup: int):
        self.run, self.rewind, self.device = run, rewind, device
        self.first_logits = run().float()
        for _ in range(warmup):  # compilation and autotuning stay out of the samples
            rewind.flush()
            run()
        rewind.flush()

    def time(self, reps: int):
        return time_eager(self.run, self.device, self.rewind, reps, 0)


def step_of(model: Qwen36Model, cache: Qwen36Cache, ids: torch.Tensor, kind: str, device: torch.device,
            flusher: L2Flusher) -> TimedStep:
    if kind == "dynamic":  # forward leaves a dynamic cache as it was: every call is the same step
        return TimedStep(lambda: model.forward(ids, cache)[0], flusher, device, 2)
    step = CapturableDecodeStep.from_prefill(model, cache, cache.length + 1)
    step.ids.copy_(ids)
    return TimedStep(step.run, RestoringFlusher(step, step.snapshot(), flusher), device, 2)


if __name__ == "__main__":
    sys.exit(main())
