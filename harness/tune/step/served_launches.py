"""Launches of each served block's call on its GPU path, counted under Triton's interpreter, at B = 1 and 8.

vLLM's own layers are built in this process at the tiny model's dims (harness/serving/vllm_inprocess.py) with the
plugin's substitutes registered and a table naming the GPU paths (`add_rms_norm` triton, `gdn_gated_norm` triton,
`gdn_layer_decode` triton, `moe_block` triton_fused_block), and each substitute's call is made as the served layer
makes it: the GDN layer's path is its own choice (`_decode_path`, its fallbacks included) over the float32 recurrent
state the served model keeps on every platform (Qwen3.5/3.6's `mamba_ssm_dtype`), so an AVX2-only CPU, whose vLLM
keeps the tiny model's state in bf16, counts the same calls as an AVX-512 one. Each call is counted by
harness/tune/measure/launch_count.py: every ATen op that computes and every Triton launch. What stays vLLM's inside the
served GDN call (projections, layout code, out_proj) is counted apart from the model's core, as it runs here: vLLM's
CPU kernels, and its torch.compile'd layout helper (`prepare_gdn_attention_core_inputs`, which cannot be traced under
the counter's dispatch mode) eagerly, op by op, where a server runs it compiled: that part is an upper bound.

vLLM's own GPU layers cannot be counted here: their forward calls vLLM's CUDA kernels, and this workplace has no
CUDA build of vLLM. The same calls on vLLM's own layers are counted on its CPU kernels, labelled so.

    TRITON_INTERPRET=1 python3 -m harness.tune.step.served_launches --out counts.json

tests/perf_gates/test_served_gpu_path_launches.py runs it and fails when a served call's count grows
(fixtures/gates/served-gpu-path-launches.json).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

GPU_PATHS = {"add_rms_norm": "triton", "gdn_gated_norm": "triton", "gdn_layer_decode": "triton",
             "moe_block": "triton_fused_block"}
SLOTS = 16


def _weights(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Random float32 weights; copying them into vLLM's parameters casts each to its own dtype."""
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) * 0.1 for name, shape in shapes.items()}


def norm_layers(cfg, g: torch.Generator):
    """vLLM's GemmaRMSNorm and the GDN layer's RMSNormGated (gate after the norm, SiLU) at `cfg`'s dims, bf16 random
    weights drawn from `g` (the plugin's substitutes where they are registered)."""
    from harness.serving import vllm_inprocess

    hidden = cfg.model_config.hf_text_config.hidden_size
    v_dim = cfg.model_config.hf_text_config.linear_value_head_dim
    norm = vllm_inprocess.build_norm(cfg, "gemma", (torch.randn(hidden, generator=g) * 0.3).to(torch.bfloat16), 1e-6)
    gated = vllm_inprocess.build_norm(cfg, "gated", (torch.rand(v_dim, generator=g) + 0.5).to(torch.bfloat16), 1e-6,
                                      norm_before_gate=True, activation="silu")
    return norm, gated


def _layers(cfg, served: bool):
    """(add + norm, gated norm, MoE block, GDN layer) as vLLM builds them, the plugin's where `served`."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    from harness.serving import vllm_inprocess

    g = torch.Generator().manual_seed(0)
    norm, gated = norm_layers(cfg, g)
    tag = "served" if served else "own"
    with set_current_vllm_config(cfg):
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            moe = vllm_inprocess.build_moe_block(cfg, f"model.layers.1.mlp_{tag}",
                                                 _weights(vllm_inprocess.moe_block_shapes(cfg), 1), torch.device("cpu"))
            gdn = QwenGatedDeltaNetAttention(cfg.model_config.hf_text_config, vllm_config=cfg,
                                             prefix=f"model.layers.0.linear_attn_{tag}", gqa_interleaved_layout=True)
        finally:
            torch.set_default_dtype(default)
        gdn_weights = _weights({name: tuple(p.shape) for name, p in gdn.named_parameters()}, 2)
        for name, p in gdn.named_parameters():
            p.data.copy_(gdn_weights[name])
        process_weights_after_loading(gdn, cfg.model_config, torch.device("cpu"))
    (conv_shape, ssm_shape), (conv_dtype, ssm_dtype) = gdn.get_state_shape(), gdn.get_state_dtype()
    gdn.kv_cache = (torch.randn(SLOTS, *conv_shape, generator=g).to(conv_dtype),
                    (torch.randn(SLOTS, *ssm_shape, generator=g) * 0.1).to(ssm_dtype))
    return norm, gated, moe, gdn


def _count(fn) -> int:
    """The launches of one call of `fn`, after one uncounted call: what a first call builds once (the served MoE
    block compares its kept weights with vLLM's) is not a per-call launch."""
    from harness.tune.measure.launch_count import count_launches

    with torch.no_grad():
        fn()
    return sum(count_launches(lambda trace: fn()).values())


def _count_gdn(gdn, x, meta, path: str) -> dict[str, int]:
    """The served GDN call's launches: the model's core (the stacked row and the fused kernel) and vLLM's code around
    it (projections, layout, out_proj)."""
    from harness.tune.measure.launch_count import count_launches

    core = gdn._core_triton
    compiled = type(gdn).prepare_gdn_attention_core_inputs
    eager = getattr(compiled, "_torchdynamo_orig_callable", None) or getattr(compiled, "__wrapped__", compiled)

    def call(trace):
        def traced(*args):
            with trace("model path"):
                return core(*args)

        gdn._core_triton = traced  # instance attributes over the class's methods, for this call
        gdn.prepare_gdn_attention_core_inputs = eager.__get__(gdn)
        try:
            gdn._served_decode(x, meta, path)
        finally:
            del gdn._core_triton, gdn.prepare_gdn_attention_core_inputs

    with torch.no_grad():
        call(lambda kind: contextlib.nullcontext())  # the uncounted first call, as _count makes
    counts = count_launches(call)
    return {"model path": counts.get("model path", 0), "vLLM's around it": counts.get("other", 0)}


def _calls(cfg, layers, batch: int, served: bool) -> dict[str, int]:
    from vllm.forward_context import set_forward_context

    from patches.model_paths import served_gdn

    norm, gated, moe, gdn = layers
    hidden = cfg.model_config.hf_text_config.hidden_size
    g = torch.Generator().manual_seed(batch)
    x, residual = (torch.randn(batch, hidden, generator=g).to(torch.bfloat16) for _ in range(2))
    v_dim = gated.weight.shape[0]
    heads = gdn.num_v_heads // gdn.tp_size
    xv, zv = (torch.randn(batch * heads, v_dim, generator=g).to(torch.bfloat16) for _ in range(2))
    counts = {"add_rms_norm": _count(lambda: norm(x, residual)), "gdn_gated_norm": _count(lambda: gated(xv, zv))}
    with set_forward_context(None, cfg):
        counts["moe_block"] = _count(lambda: moe(x))
    if served:  # vLLM's own GDN forward needs a running engine's metadata; the substitute's served call does not
        meta = SimpleNamespace(num_decodes=batch, non_spec_state_indices_tensor=torch.arange(batch, dtype=torch.int32))
        path = gdn._decode_path(meta, x)  # the served layer's own choice, its fallbacks included
        if path is None:
            state = gdn.kv_cache[1].dtype
            raise SystemExit(f"served_launches: the served GDN layer leaves this decode step to vLLM's own (table "
                             f"{served_gdn.DECODE.path(batch, 1, x.device, x.dtype)!r}, recurrent state {state}): "
                             "nothing of the plugin's to count")
        counts["gdn_layer_decode"] = _count_gdn(gdn, x, meta, path)
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,8")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("served_launches: run it with TRITON_INTERPRET=1 (the GPU paths run through Triton's interpreter "
              "on this CPU)", file=sys.stderr)
        return 2

    from harness.serving import vllm_inprocess
    from harness.serving.tiny_model import TinyRecipe
    from harness.tune.table.build import table_serving
    from model.dispatch.table import TABLE_ENV, clear_table_cache
    from patches.core.registry import PatchState, apply_patches
    from patches.model_paths import served_gdn, served_moe, served_norms
    from patches.settings import PatchSettings

    served_patches = (served_norms.PATCH, served_gdn.PATCH, served_moe.PATCH)
    cfg = vllm_inprocess.eager_config(TinyRecipe.load().hf_config(eos_id=1, pad_id=0), torch.bfloat16)
    # The GDN recurrent state as the served model keeps it on every platform: Qwen3.5/3.6's config says
    # mamba_ssm_dtype float32, which vLLM applies (Qwen3_5ForConditionalGenerationConfig). The tiny Qwen3-Next config
    # does not, and vLLM's CPU platform gives it float32 only where it has AVX-512 BF16: without this an AVX2 CPU
    # would count vLLM's own layer (the fused kernel refuses a bf16 state), not the plugin's GPU path.
    cfg.cache_config.mamba_ssm_cache_dtype = "float32"
    batches = [int(b) for b in a.batches.split(",")]
    result = {"dims": "the tiny model (fixtures/tiny_model/recipe.yaml), bf16", "paths": GPU_PATHS,
              "served (GPU paths, interpreter)": {}, "vLLM's own (its CPU kernels)": {}}
    with tempfile.TemporaryDirectory() as d, vllm_inprocess.process_groups(cfg):
        own = _layers(cfg, served=False)
        for b in batches:
            result["vLLM's own (its CPU kernels)"][f"B={b}"] = _calls(cfg, own, b, served=False)
        table = Path(d) / "gpu-paths.json"
        table.write_text(json.dumps(table_serving(GPU_PATHS, "cpu", "bfloat16")))
        os.environ[TABLE_ENV] = str(table)
        clear_table_cache()
        env = {patch.switch: "1" for patch in served_patches}
        rows = apply_patches(PatchSettings.from_env(env, served_patches), served_patches)
        if any(r.state is not PatchState.APPLIED for r in rows):
            print("served_launches: " + "; ".join(f"{r.name} {r.state.value}: {r.detail}" for r in rows),
                  file=sys.stderr)
            return 1
        try:
            layers = _layers(cfg, served=True)
            for b in batches:
                result["served (GPU paths, interpreter)"][f"B={b}"] = _calls(cfg, layers, b, served=True)
        finally:
            for patch in served_patches:
                patch.uninstall()
    for side in ("served (GPU paths, interpreter)", "vLLM's own (its CPU kernels)"):
        for batch, counts in result[side].items():
            print(f"{side:34} {batch}: {counts}", flush=True)
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
