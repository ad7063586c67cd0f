"""Kernel launches per decode step by block kind (harness/tune/measure/launch_count.py: every ATen op that computes and
every Triton launch), for the model's default paths and for a dispatch table that serves chosen paths, at the tiny
dims with the real model's layer structure (40 layers: 30 GDN, 10 attention). On a CPU the Triton paths run
through the interpreter, slowly (12 minutes for the default 40 layers and two batch sizes on a 2-core machine):

    TRITON_INTERPRET=1 python3 tools/step_launch_count.py --layers 40 --batches 1,8 --out counts.json

For paths made of GEMMs and Triton kernels the count is the CUDA kernel count; torch composites count what they
dispatch to on the device that runs this (on a CPU `F.rms_norm` is five ops, where CUDA may run one kernel).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from harness.tune.measure.inputs import rank_config, rank_weights
from harness.tune.measure.launch_count import count_launches
from harness.tune.step.run import TINY_MODEL
from harness.tune.table.build import table_serving
from model.dispatch.table import TABLE_ENV, clear_table_cache
from model.qwen36 import CapturableDecodeStep, Qwen36Config, Qwen36Model

FEW_LAUNCH_PATHS = "moe_block=triton_fused_block,gdn_layer_decode=triton,attention_layer_decode=triton,add_rms_norm=triton"


def _counts(layers: int, batch: int, device: torch.device) -> dict[str, int]:
    cfg = rank_config(Qwen36Config.from_hf_dict({**TINY_MODEL, "num_hidden_layers": layers}), 1)
    model = Qwen36Model(rank_weights(cfg, torch.float32, device, seed=3))
    ids = torch.randint(0, cfg.vocab_size, (batch, 5), generator=torch.Generator().manual_seed(7)).to(device)
    _, cache = model.forward(ids)
    step = CapturableDecodeStep.from_prefill(model, cache, 12)
    step.run(ids[:, -1:])  # the warm-up step: what a first call builds once is not a per-step launch
    counts = count_launches(lambda trace: model.forward(step.ids, step.cache, trace=trace))
    return {**counts, "total": sum(counts.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=40)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--paths", default=FEW_LAUNCH_PATHS, help="block=path,... the table serves (default: %(default)s)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    served = dict(item.split("=", 1) for item in a.paths.split(","))
    device = torch.device(a.device)
    result = {"layers": a.layers, "device": str(device), "served": served, "counts": {}}
    with tempfile.TemporaryDirectory() as d:
        table = Path(d) / "table.json"
        table.write_text(json.dumps(table_serving(served, device.type if device.type == "cpu" else
                                                  torch.cuda.get_device_name(device), "float32")))
        for side, setting in (("default", "off"), ("table", str(table))):
            os.environ[TABLE_ENV] = setting
            clear_table_cache()
            for batch in map(int, a.batches.split(",")):
                counts = _counts(a.layers, batch, device)
                result["counts"][f"{side} B={batch}"] = counts
                print(f"{side} paths, B={batch}: {counts}", flush=True)
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
