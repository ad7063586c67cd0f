"""GDN on the GPU at the real per-rank dims of Qwen3.6 under TP=4: 4 key heads and 8 value heads of 128.

bfloat16 (and float32) q/k/v through the chunked prefill and the decode step, against the float64 recurrent
reference computed on the same device from the same inputs upcast; prints errors and CUDA-event timings
(after warm-up) and, when GPU_REPORT_DIR is set, writes them as JSON (one file per test) for the note.
Runs on torch >= 2.4 with CUDA (checked on 2.11); skipped without a CUDA device.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from model.gdn import CONV_PATHS, GDN_RULE_PATHS, GDNDims, run_conv_path, run_gdn_rule
from tests.numerics.compare import assert_close, poisoned_like, relative_error
from tests.numerics.gdn_attention_cases import generator, random_recurrent_state, randn, rule_inputs
from model.tolerances import gdn_rule_tolerance

pytestmark = pytest.mark.gpu

F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64
PER_RANK = GDNDims(hidden_size=2048, num_k_heads=4, num_v_heads=8, head_k_dim=128, head_v_dim=128, conv_kernel=4)
WARMUP, ITERS = 3, 20


def _device() -> torch.device:
    return torch.device("cuda")


def _to(tensors, device):
    return [t.to(device) for t in tensors]


def cuda_time_ms(fn, warmup: int = WARMUP, iters: int = ITERS) -> float:
    """Median milliseconds of `fn()` over `iters` runs, timed with CUDA events after `warmup` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def report(name: str, rows: list[dict]) -> None:
    print(f"\n{name} ({torch.cuda.get_device_name()}, torch {torch.__version__})")
    for row in rows:
        print("  " + "  ".join(f"{k}={v:.3e}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    directory = os.environ.get("GPU_REPORT_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        payload = {
            "test": name,
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "dims": PER_RANK.__dict__,
            "warmup": WARMUP,
            "iters": ITERS,
            "rows": rows,
        }
        (Path(directory) / f"{name}.json").write_text(json.dumps(payload, indent=2))


def reference(q, k, v, g, beta, state):
    return run_gdn_rule(GDN_RULE_PATHS.reference.name, q.double(), k.double(), v.double(), g.double(), beta.double(), state.double())


@pytest.mark.parametrize("dtype", [BF16, F32], ids=str)
def test_gpu_chunked_prefill_per_rank_dims(dtype):
    device = _device()
    rows = []
    for tokens in (63, 64, 65, 1024, 4096, 16384):
        gen = generator(tokens)
        q, k, v, g, beta = _to(rule_inputs(gen, 1, tokens, PER_RANK, dtype), device)
        state = random_recurrent_state(gen, 1, PER_RANK).to(device)
        out = poisoned_like(v.shape, dtype, device)
        final = poisoned_like(state.shape, F32, device)
        run_gdn_rule("chunked", q, k, v, g, beta, state, out=out, final_state=final)
        row = {"tokens": tokens, "dtype": str(dtype)}
        if tokens <= 4096:  # the float64 token loop is the slow part; 16384 is timed only
            ref_out, ref_state = reference(q, k, v, g, beta, state)
            bound = gdn_rule_tolerance("chunked", dtype)
            row["out_rel_err"] = assert_close(out, ref_out, bound, f"chunked {dtype} T={tokens} output")
            row["state_rel_err"] = assert_close(final, ref_state, bound, f"chunked {dtype} T={tokens} state")
        ms = cuda_time_ms(lambda: run_gdn_rule("chunked", q, k, v, g, beta, state))
        row["ms"] = ms
        row["tokens_per_s"] = tokens / ms * 1e3
        rows.append(row)
    report(f"gdn_gpu_chunked_prefill_{str(dtype).split('.')[-1]}", rows)


@pytest.mark.parametrize("dtype", [BF16, F32], ids=str)
def test_gpu_decode_step_per_rank_dims(dtype):
    """One step at several batch sizes, and 64 consecutive steps handing the float32 state along."""
    device = _device()
    rows = []
    for batch in (1, 8, 64, 256):
        gen = generator(batch)
        q, k, v, g, beta = _to(rule_inputs(gen, batch, 1, PER_RANK, dtype), device)
        state = random_recurrent_state(gen, batch, PER_RANK).to(device)
        out, final = run_gdn_rule("decode_step", q, k, v, g, beta, state)
        ref_out, ref_state = reference(q, k, v, g, beta, state)
        bound = gdn_rule_tolerance("decode_step", dtype)
        rows.append({
            "batch": batch,
            "steps": 1,
            "out_rel_err": assert_close(out, ref_out, bound, f"decode {dtype} B={batch} output"),
            "state_rel_err": assert_close(final, ref_state, bound, f"decode {dtype} B={batch} state"),
            "ms": cuda_time_ms(lambda: run_gdn_rule("decode_step", q, k, v, g, beta, state)),
        })
    steps = 64
    gen = generator(steps)
    q, k, v, g, beta = _to(rule_inputs(gen, 8, steps, PER_RANK, dtype), device)
    state = random_recurrent_state(gen, 8, PER_RANK).to(device)
    ref_out, ref_state = reference(q, k, v, g, beta, state)
    outs = []
    for t in range(steps):
        o, state = run_gdn_rule("decode_step", *(x[:, t : t + 1] for x in (q, k, v, g, beta)), state)
        outs.append(o)
    bound = gdn_rule_tolerance("decode_step", dtype)
    rows.append({
        "batch": 8,
        "steps": steps,
        "out_rel_err": assert_close(torch.cat(outs, 1), ref_out, bound, f"{steps} decode steps {dtype} output"),
        "state_rel_err": assert_close(state, ref_state, bound, f"{steps} decode steps {dtype} state"),
    })
    report(f"gdn_gpu_decode_step_{str(dtype).split('.')[-1]}", rows)


def test_gpu_conv_update_and_prefill_per_rank_dims():
    """The short conv at the per-rank conv_dim (2048 channels), bf16 activations, against the float64 sum."""
    device = _device()
    rows = []
    channels, kernel = PER_RANK.conv_dim, PER_RANK.conv_kernel
    for name, batch, tokens in (("update", 64, 1), ("prefill", 1, 4096)):
        gen = generator(tokens)
        x = randn(gen, batch, tokens, channels, dtype=BF16).to(device)
        weight = randn(gen, channels, kernel, dtype=BF16, scale=0.5).to(device)
        state = randn(gen, batch, channels, kernel - 1, dtype=BF16).to(device)
        y, new_state = run_conv_path(name, x, weight, state)
        ref_y, ref_state = run_conv_path(CONV_PATHS.reference.name, x.double(), weight.double(), state.double())
        rows.append({
            "path": name,
            "batch": batch,
            "tokens": tokens,
            "out_rel_err": relative_error(y, ref_y),
            "state_exact": bool(torch.equal(new_state, ref_state.to(BF16))),
            "ms": cuda_time_ms(lambda: run_conv_path(name, x, weight, state)),
        })
        assert rows[-1]["out_rel_err"] <= 1e-2 and rows[-1]["state_exact"], rows[-1]
    report("gdn_gpu_conv", rows)
