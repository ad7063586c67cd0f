"""What the served GDN layer's state handling costs per eager call on a GPU: the fused decode kernel over a
server's state slots gathered and written back (2 index_select + kernel + 2 index_copy_, as the served layer first
did) against the kernel indexing the slots in place (its `rows` argument), at the real per-rank dims of Qwen3.6
under TP=4. Eager wall time per call (host-bound at decode sizes), interleaved rounds; prints JSON.

    python3 tools/served_gdn_state_cost.py [--slots 64] [--rounds 7] [--calls 200]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from model.gdn import GDNDims, GDNState, triton_decode_layer
from tests.numerics.test_gdn_decode_layer import DecodeCase, decode_inputs

REAL = GDNDims(hidden_size=2048, num_k_heads=4, num_v_heads=8, head_k_dim=128, head_v_dim=128, conv_kernel=4)


def per_call_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=200)
    a = p.parse_args()
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(), "dims": "per-rank TP=4, bf16", "us_per_call": {}}
    for batch in (1, 8):
        x, w, state = decode_inputs(DecodeCase("real", batch, "bfloat16", 0), dev, dims=REAL)
        proj = F.linear(x.reshape(batch, -1), w.in_proj_stacked)
        conv = torch.zeros((a.slots, *state.conv.shape[1:]), dtype=state.conv.dtype, device=dev)
        rec = torch.zeros((a.slots, *state.recurrent.shape[1:]), dtype=state.recurrent.dtype, device=dev)
        rows = torch.arange(1, 2 * batch, 2, dtype=torch.int32, device=dev)
        long_rows = rows.long()

        def gathered():
            s = GDNState(conv.index_select(0, long_rows), rec.index_select(0, long_rows))
            triton_decode_layer.fused_decode_core(proj, w, s, s)
            conv.index_copy_(0, long_rows, s.conv)
            rec.index_copy_(0, long_rows, s.recurrent)

        cache = GDNState(conv, rec)

        def indexed():
            triton_decode_layer.fused_decode_core(proj, w, cache, cache, rows)

        runs = {"gathered": [], "indexed": []}
        for fn in (gathered, indexed):
            per_call_us(fn, 20)  # compile and warm
        for _ in range(a.rounds):
            for name, fn in (("gathered", gathered), ("indexed", indexed)):
                runs[name].append(per_call_us(fn, a.calls))
        out["us_per_call"][f"B{batch}"] = {n: {"median": round(statistics.median(v), 2), "min": round(min(v), 2),
                                               "max": round(max(v), 2)} for n, v in runs.items()}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
