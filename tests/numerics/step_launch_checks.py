"""Kernel launches of one static decode step by block kind (harness.tune.measure.launch_count), with a dispatch table that
serves every block its few-launch path, on the CPU through Triton's interpreter; and the step's logits close to
the same step on the default paths.

Not collected by the suite itself: the interpreter must be chosen before triton is imported, so
test_step_launches_interpreter.py runs this module in a subprocess with TRITON_INTERPRET=1. By hand:

    TRITON_INTERPRET=1 python -m pytest tests/numerics/step_launch_checks.py -p no:xdist

The launch budget per block is the design of each path (its docstring): the GDN decode layer and the attention
decode layer are a stacked input GEMM, one kernel and the output GEMM; the residual add + RMSNorm is one kernel.
For paths made of GEMMs and Triton kernels the count is the CUDA kernel count; the default paths' counts are CPU
decompositions (F.rms_norm is five ops here) and are printed, not asserted.
"""
from __future__ import annotations

import json

import torch

from harness.tune.measure.inputs import rank_config, rank_weights
from harness.tune.measure.launch_count import count_launches
from harness.tune.step.run import TINY_MODEL
from harness.tune.table.build import table_serving
from model.dispatch.table import TABLE_ENV, clear_table_cache
from model.qwen36 import CapturableDecodeStep, Qwen36Config, Qwen36Model
from tests.numerics.compare import relative_error

FEW_LAUNCH_PATHS = {"moe_block": "triton_fused_block", "gdn_layer_decode": "triton",
                    "attention_layer_decode": "triton", "add_rms_norm": "triton"}
DTYPE = torch.float32
PREFILL, MAX_LEN = 5, 12  # the prompt, then a warm-up step and the ones counted


def _table(path, dtype: torch.dtype) -> None:
    path.write_text(json.dumps(table_serving(FEW_LAUNCH_PATHS, "cpu", str(dtype).removeprefix("torch."))))


def _step(batch: int):
    cfg = rank_config(Qwen36Config.from_hf_dict(TINY_MODEL), 1)  # layers: GDN, GDN, GDN, attention
    model = Qwen36Model(rank_weights(cfg, DTYPE, torch.device("cpu"), seed=3))
    ids = torch.randint(0, cfg.vocab_size, (batch, PREFILL), generator=torch.Generator().manual_seed(7))
    _, cache = model.forward(ids)
    return cfg, model, CapturableDecodeStep.from_prefill(model, cache, MAX_LEN), ids[:, -1:]


def _served_step(monkeypatch, tmp_path, batch: int, table: bool):
    """The model and a static step after one warm-up step: what a first call builds once (the stacked projection
    weights, the rope table) is not a per-step launch."""
    if table:
        _table(tmp_path / "cpu.json", DTYPE)
        monkeypatch.setenv(TABLE_ENV, str(tmp_path / "cpu.json"))
    else:
        monkeypatch.setenv(TABLE_ENV, "off")
    clear_table_cache()
    cfg, model, step, ids = _step(batch)
    step.run(ids)
    return cfg, model, step, ids


def test_the_few_launch_step_launches_its_budget_and_agrees_with_the_default_step(monkeypatch, tmp_path):
    """B = 2 sequences, the same weights and prefill on both sides. The few-launch step launches each block's
    budget; its logits agree with the default paths' (float32; the fused kernels keep float32 on chip where the
    defaults round between ops, so close, not equal). The default step's launches are printed beside them."""
    counts, logits = {}, {}
    for table in (False, True):
        cfg, model, step, ids = _served_step(monkeypatch, tmp_path, 2, table)
        step.ids.copy_(ids)
        counts[table] = count_launches(lambda trace: model.forward(step.ids, step.cache, trace=trace))
        print(f"{'few-launch' if table else 'default'} paths, B=2: {counts[table]}, total {sum(counts[table].values())}")
        logits[table] = step.run(ids)
    few = counts[True]
    layers = cfg.num_hidden_layers
    gdn_layers = cfg.layer_types.count("linear_attention")
    assert few["gdn"] == 3 * gdn_layers, few
    assert few["attention"] == 3 * (layers - gdn_layers), few
    assert few["norm"] == 1 + 2 * layers, few  # the first norm, then each residual add + norm
    assert few["embed"] == 1 and few["lm_head"] == 1, few
    assert few["moe"] == 4 * layers, few  # the fused block: four launches (model.moe.triton_block)
    assert sum(few.values()) < sum(counts[False].values()) / 5, counts
    assert relative_error(logits[True], logits[False]) <= 1e-4
