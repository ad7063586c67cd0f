"""Every numeric bound of the model's compute paths, stated once: the numerics suite (tests/numerics) holds each
path to them, and `qwen36 tune` checks every output it times against them. They describe the paths, so they
live with the paths, below both readers.

Metric: relative error ||out - ref|| / ||ref|| (Frobenius) against a float64 reference computed from the
same low-precision inputs, upcast. Where the output is a sum that can nearly cancel, the error is taken against
the size of the terms instead: the MoE block (routed plus shared norms) and the routed experts
(model.moe.experts.experts_magnitude: the reference's sums over absolute values), so the bound measures the
path, not how close to zero a case's output happens to fall. Bounds are set with margin over what the paths reach (measured with the
`ci` profile, see docs/numerics.md); float32 paths sit far under 1e-5 and bf16 paths under 2e-2.
Add a block's table here when you add the block; a registered path without an entry fails the suite.
"""
from __future__ import annotations

import torch

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16

# Routed-expert paths (model.moe.EXPERT_PATHS), per dtype, against the size of the terms (experts_magnitude).
# float32 measured on a CPU over 500 random cases and one that nearly cancels (tools/moe_expert_error_scale.py
# --seed 1, then 2; 2026-12-04): at most 3.4e-8 (against ||reference||: 3.7e-6, all from the cancelling case),
# where a path 1e-5 off reads 2.7e-8 to 2.3e-6 (median 2.5e-7). So 2e-7 passes every legitimate case seen with
# 6x margin and catches such a path (tests/numerics/test_moe_checker_catches_bugs.py).
MOE_EXPERT_PATHS: dict[str, dict[torch.dtype, float]] = {
    name: {F64: 1e-12, F32: 2e-7, BF16: 1.5e-2, F16: 2e-3}
    for name in ("reference", "decode_fused", "tiny_bmm", "tiny_tokenwise", "sorted", "grouped_mm", "dense_bmm")
}
# The Triton paths (no float64 kernels). triton_decode keeps its intermediate in float32; triton_grouped
# rounds act and the per-expert outputs to the input dtype, as grouped_mm does, and its float32 GEMMs
# accumulate K=2048 products in one sequential chain (measured 1.34e-6 at the real dims on the H200, where
# the cuBLAS paths reach 4e-7), hence its wider float32 bound. Measured bf16 at the real dims: decode 1.7e-3,
# grouped 3.2e-3. Triton's CPU interpreter truncates float32 -> bfloat16 where the GPU rounds to nearest,
# which doubles to triples the bf16 error in the CI runs (up to 9e-3 seen); the bf16 bound still holds it.
MOE_EXPERT_PATHS.update(
    {
        "triton_decode": {F32: 2e-6, BF16: 1.5e-2, F16: 2e-3},
        "triton_grouped": {F32: 5e-6, BF16: 1.5e-2, F16: 2e-3},
    }
)

# The whole sparse MoE block (router + experts + shared expert), sharded or not. Routing weights are float32
# by definition (as in vLLM), so even a float64 block differs from the reference by float32 rounding of
# the weights when the router variant differs.
MOE_BLOCK: dict[torch.dtype, float] = {F64: 1e-6, F32: 2e-6, BF16: 2e-2, F16: 3e-3}

# The block's paths (model.moe.MOE_BLOCK_PATHS), measured as MOE_BLOCK is (against ||routed|| + ||shared||, the
# float64 block routed by the same low-precision logits). `composed` is the block above. `triton_fused_block`
# keeps the shared gate's logit, both activations and the whole sum in float32 and rounds once, at the output,
# so it sits well inside MOE_BLOCK: float32 measured at most 2.1e-7 over 60 random cases at small dims (T <= 8,
# every pattern, Is != I) and 2.5e-7 at the real dims (T = 1, 2; H 2048, E 256, k 8, I = Is = 128), both through
# Triton's CPU interpreter (2026-12-04); 1e-6 leaves 4x over that and still fails a block wrong by 1e-5
# relative (tests/numerics/moe_block_interpreter_checks.py). bf16: the output's rounding, 2.5e-3 through the
# interpreter (which truncates float32 -> bfloat16; the GPU rounds to nearest, about half that); float16 2^-11.
MOE_BLOCK_PATHS: dict[str, dict[torch.dtype, float]] = {
    "composed": MOE_BLOCK,
    "triton_fused_block": {F32: 1e-6, BF16: 1e-2, F16: 2e-3},
}

# Router weights of the top-k -> softmax variant against the reference (same logits).
ROUTER_WEIGHTS: dict[torch.dtype, float] = {F32: 1e-6}

# HF transformers blocks against ours, same weights, float32 (independent implementations).
TRANSFORMERS_MOE_F32 = 1e-5


def expert_path_tolerance(name: str, dtype: torch.dtype) -> float:
    try:
        return MOE_EXPERT_PATHS[name][dtype]
    except KeyError:
        raise KeyError(
            f"no tolerance for MoE expert path {name!r} in {dtype}: add it to model/tolerances.py"
        ) from None

# ------------------------------------------------------------------------------------------------------
# Gated DeltaNet, norms, gated attention, TP and the whole model (issue 3).

# Gated-delta-rule paths (model.gdn.GDN_RULE_PATHS) against the float64 recurrent reference on the same
# (upcast) inputs, outputs and final state alike. Low-precision paths compute in float32 with a float32
# state; bf16 error is the rounding of the bf16 output. Measured max over 40 random cases (T <= 200):
# chunked f64 3e-16, f32 1.6e-7 (out) / 1.4e-7 (state), bf16 1.9e-3; decode_step f32 2.7e-7, bf16 2.2e-3.
# (HF's cumsum-difference decays reach 8e-6 / 1.3e-5 in f32 on per-token-varying decays; see model.gdn.rule.)
GDN_RULE_PATHS: dict[str, dict[torch.dtype, float]] = {
    name: {F64: 1e-12, F32: 2e-6, BF16: 1e-2}
    for name in ("recurrent_reference", "chunked", "decode_step")
}
# fla-core's kernels (model.gdn.fla_paths), CUDA only, held to the same bounds in the dtypes they take:
# the chunk form takes bf16 only (its dots would run in tf32 on float32 inputs).
GDN_RULE_PATHS["fla_chunk"] = {BF16: 1e-2}
GDN_RULE_PATHS["fla_recurrent"] = {F32: 2e-6, BF16: 1e-2}

# Causal conv1d paths (model.gdn.CONV_PATHS) against the float64 window sum.
GDN_CONV_PATHS: dict[str, dict[torch.dtype, float]] = {
    name: {F64: 1e-13, F32: 1e-6, BF16: 1e-2} for name in ("reference", "prefill", "update")
}
# The Triton kernel (float32 taps, low-precision inputs only): float16 rounds the output to 2^-11 relative.
GDN_CONV_PATHS["triton"] = {F32: 1e-6, BF16: 1e-2, F16: 2e-3}

# The whole GDN layer (projections, conv, gating, rule, gated norm, out_proj) in float32 serving paths
# against the all-reference layer in float64: the float32 projections add to the rule's error. Measured
# (2026-12-01, `tools/gdn_error_tail.py --seconds 60` on CPU: 3874 random seeds at T in 2..140): median
# 3.0e-7, P99 1.4e-6, max 7.8e-6; hypothesis's dev profile then found seed 9228 at T=2 with 1.15e-5
# (chunked) and 1.0e-5 (two decode steps), opposite in sign. The bound had been 1e-5, under that tail.
GDN_LAYER: dict[torch.dtype, float] = {F32: 3e-5}

# State hand-over: a split prefill / N decode steps against one pass of the same path family, same dtype.
# In float32 the two sides are different paths (decode_step against chunked), each within GDN_LAYER of the
# reference, so they may differ by twice that: seed 9228 above differs by 2.15e-5 (random seeds: max
# 9.4e-6, 2 of 3874 over the old 5e-6 bound).
GDN_HANDOVER: dict[torch.dtype, float] = {F64: 1e-12, F32: 2 * GDN_LAYER[F32]}

# The GDN decode layer paths (model.gdn.GDN_DECODE_LAYER_PATHS, T == 1) against the float64 reference layer:
# the output (GDN_DECODE_LAYER) and both state parts (GDN_DECODE_LAYER_STATE), on tests/numerics/
# test_gdn_decode_layer.py's cases (HV/H = 1, 2, 4, odd head dims, B 1..5). Measured max (CPU, 2026-12-05;
# staged over 1200 cases, triton under Triton's interpreter over 160 plus staged's two worst):
#   float32  output: staged 4.0e-6, triton 2.7e-6 (medians 2e-7);  state: 2.9e-7 both
#   bf16     output: staged 1.19e-1, triton 3.5e-2 (medians 4e-3, P99 2e-2);  state: staged 6.1e-3, triton 2.9e-3
#   float16  output: staged 1.6e-2, triton 4.6e-3;  state: staged 8.3e-4, triton 6.3e-4
# The output's tail is conditioning, not the paths: a head whose decay wipes its state (g down to -40 with
# A_log's range) has o = (k.q) beta v, and where |o|^2 / V falls under the norm's eps the gated norm passes
# o's scale through, so k.q's rounding, amplified by its cancellation, reaches the output (the same seeds
# are the worst in every dtype). `staged` rounds the conv output and o to the activation dtype on the way,
# `triton` keeps both in float32, hence its smaller tail. Bounds: ~2x to 7x over those maxima. The state is
# well conditioned, so its float32 bound (2e-6) is 7x over the worst case and rejects a state 1e-5 off
# (gdn_decode_interpreter_checks.py's decay mutant); the float32 output bound (2e-5) is 5x over its worst
# case and so lets an error of 1e-5 in the output alone through (the state bound does not). The reference
# against itself is the same computation: no error.
GDN_DECODE_LAYER: dict[str, dict[torch.dtype, float]] = {
    "reference": {F64: 0.0, F32: 0.0, BF16: 0.0, F16: 0.0},
    "staged": {F64: 1e-12, F32: 2e-5, BF16: 2.5e-1, F16: 4e-2},
    "triton": {F32: 2e-5, BF16: 8e-2, F16: 1.5e-2},
}
GDN_DECODE_LAYER_STATE: dict[str, dict[torch.dtype, float]] = {
    "reference": {F64: 0.0, F32: 0.0, BF16: 0.0, F16: 0.0},
    "staged": {F64: 1e-12, F32: 2e-6, BF16: 1.5e-2, F16: 2e-3},
    "triton": {F32: 2e-6, BF16: 1e-2, F16: 2e-3},
}

# Norm paths (model.norm.rms_norm) against their reference. The output's rounding is the error: `triton` measured
# bf16 1.6e-3 to 2.0e-3 on the H200 at the real shapes (tests/numerics/test_norm_gpu.py, 2026-12-04) and
# 3.3e-3 under Triton's CPU interpreter (which truncates float32 -> bfloat16); float16 2e-4; float32 under
# 1e-7. `triton` (model.norm.triton_rms_norm) has no float64 kernel.
NORM_PATHS: dict[str, dict[torch.dtype, float]] = {
    name: {F64: 1e-14, F32: 1e-6, BF16: 8e-3, F16: 1e-3} for name in ("reference", "fused")
}
NORM_PATHS["triton"] = {F32: 1e-6, BF16: 8e-3, F16: 1e-3}
# vLLM's own RMSNormGated, timed by `qwen36 tune` beside the gated-norm paths (harness/tune/blocks/vllm_own.py).
NORM_PATHS["vllm"] = {F32: 1e-6, BF16: 8e-3, F16: 1e-3}

# Residual add + zero-centred RMSNorm paths (model.norm.rms_norm.ADD_RMS_NORM_PATHS), both outputs against the float64
# sum h64 + y64 and its norm: h_new is the sum rounded once to h's dtype (at most u: 2^-8 bf16, 2^-11 f16, 2^-24
# f32), and normed is the norm of that rounded sum, so the sum's rounding adds to the norm's: a row's scale
# absorbs the rounding's mean, leaving each element at most 2u off before the output's own rounding, 3u in all
# (bf16 1.2e-2; 1.6e-2 under Triton's interpreter, whose float32 -> bfloat16 output cast truncates; float16
# 1.5e-3): NORM_PATHS's 8e-3 and 1e-3 are under that, and random cases come close. Measured (CPU, 2026-12-06,
# tests/numerics/test_add_rms_norm.py's cases; `fused` over 20000, `triton` under the interpreter over 3000,
# half of them with H <= 4): normed max bf16 5.4e-3 fused, 7.3e-3 triton (median 1.7e-3, 3.3e-3); float16
# 6.3e-4 / 5.8e-4; float32 1.9e-7 / 1.7e-7; h_new max 3.9e-3, 4.9e-4, 5.7e-8. Bounds over the 3u worst case;
# float32 is NORM_PATHS's (5x over the worst seen). `triton` is held to bit equality besides (its h_new is
# torch's h + y, its normed model.norm.triton_rms_norm's RMSNorm of it), which is what catches a wrong rounding.
ADD_NORM_PATHS: dict[str, dict[torch.dtype, float]] = {
    name: {F64: 1e-14, F32: 1e-6, BF16: 2e-2, F16: 2e-3} for name in ("reference", "fused")
}
ADD_NORM_PATHS["triton"] = {F32: 1e-6, BF16: 2e-2, F16: 2e-3}
# vLLM's own GemmaRMSNorm with a residual, timed by `qwen36 tune` beside the paths (harness/tune/blocks/vllm_own.py):
# the same computation (float32 inside, each output rounded once), so the same 3u bound.
ADD_NORM_PATHS["vllm"] = {F32: 1e-6, BF16: 2e-2, F16: 2e-3}

# Attention cores (model.attention.layer.ATTENTION_CORES) and prefix-cached vs full recomputation.
# Measured max: f32 2.1e-7, bf16 2.3e-3, f64 4e-16.
ATTENTION_CORES: dict[str, dict[torch.dtype, float]] = {
    name: {F64: 1e-13, F32: 2e-6, BF16: 1.5e-2} for name in ("reference", "sdpa")
}
ATTENTION_PREFIX: dict[torch.dtype, float] = {F64: 1e-13, F32: 2e-6}

# The attention decode layer paths (model.attention.decode_layer.ATTENTION_DECODE_LAYER_PATHS, T == 1 over a
# StaticKVCache) against the float64 reference layer: the output (ATTENTION_DECODE_LAYER) and the new key and value
# each writes into the cache (ATTENTION_DECODE_LAYER_CACHE), on tests/numerics/test_attention_decode_layer.py's
# cases (GQA groups 1, 2, 4; head_dim 16, 32; rotary a quarter, half or all of it; lengths 0..135; B 1..3).
# Measured max (CPU, 2026-12-06, a loop over the test's decode_inputs and random cases; staged over 1500 cases a
# dtype, triton under Triton's interpreter over 200):
#   float64  output: staged 1.5e-15;  key, value: 0 (the same rounding to the cache dtype)
#   float32  output: staged 5.0e-7, triton 4.4e-7 (medians 2.4e-7, 2.2e-7: the float32 GEMMs);
#            key: 1.8e-7 / 1.5e-7;  value: 1.3e-7 / 1.2e-7
#   bf16     output: staged 9.4e-3, triton 7.0e-3 (medians 4.6e-3, 4.1e-3);  key: 6.5e-3 / 6.3e-3;  value: 0
#   float16  output: staged 1.35e-3, triton 5.4e-4;  key: 7.7e-4 / 6.1e-4;  value 1.2e-4 (both)
# The low-precision errors are the output's and the key's rounding to the activation dtype (the interpreter
# truncates float32 -> bfloat16 where the GPU rounds to nearest: about twice the GPU's bf16 key error). Bounds:
# 2x to 3x over those in bf16 and float16; in float32 8x (output) and 10x (cache) over them, leaving room for the
# real dims' K = 2048 GEMMs on the GPU (cuBLAS float32 at that K: ~4e-7, MOE_EXPERT_PATHS' note) while a path
# 1e-5 off still fails; the float64 staged bound is the attention core's. The broken kernels of
# tests/numerics/attention_decode_interpreter_checks.py are off by at least 4.9e-4 (output) or 8.8e-2 (key) in
# float32 over 12 random cases each. The reference against itself is the same computation: no error.
ATTENTION_DECODE_LAYER: dict[str, dict[torch.dtype, float]] = {
    "reference": {F64: 0.0, F32: 0.0, BF16: 0.0, F16: 0.0},
    "staged": {F64: ATTENTION_CORES["sdpa"][F64], F32: 4e-6, BF16: 2e-2, F16: 3e-3},
    "triton": {F32: 4e-6, BF16: 2e-2, F16: 3e-3},
}
ATTENTION_DECODE_LAYER_CACHE: dict[str, dict[torch.dtype, float]] = {
    "reference": {F64: 0.0, F32: 0.0, BF16: 0.0, F16: 0.0},
    "staged": {F64: ATTENTION_CORES["sdpa"][F64], F32: 2e-6, BF16: 1.2e-2, F16: 2e-3},
    "triton": {F32: 2e-6, BF16: 1.2e-2, F16: 2e-3},
}

# Sum of TP rank partials against the unsharded block, float64 (reassociation of out_proj/o_proj sums only).
TP_GDN_ATTENTION_F64 = 1e-12

# The whole tiny model: our float32 logits against transformers' float32 logits (two independent float32
# computations of the same function over a few hundred tokens), and cached decode against prefill.
# Measured: 9.3e-7 (Qwen3.5 layout) and 8.4e-7 (Qwen3-Next layout) over 200 tokens.
TRANSFORMERS_MODEL_F32 = 1e-4
MODEL_DECODE_VS_PREFILL_F32 = 2e-5


def gdn_rule_tolerance(name: str, dtype: torch.dtype) -> float:
    try:
        return GDN_RULE_PATHS[name][dtype]
    except KeyError:
        raise KeyError(
            f"no tolerance for gated delta rule path {name!r} in {dtype}: add it to model/tolerances.py"
        ) from None

# Whole GDN / attention layers sharded over a real process group and all-reduced in the activation dtype,
# against the float64 unsharded layer (tests/numerics/test_tp_distributed.py).
TP_LAYER_BF16 = 2e-2
TP_LAYER_F32 = 1e-5
