"""The whole tiny model against transformers, for both checkpoint layouts.

Tiny random checkpoints are built here from a fixed seed with transformers' own Qwen3.5-MoE and Qwen3-Next
classes (eager attention, eager experts), saved as safetensors and loaded by `Qwen36Weights`; nothing is
downloaded. Checks: float32 logits over a prompt of a few hundred tokens, 32 greedy tokens, every MoE
expert path forced through the dispatcher, and our own cache hand-over (chunked prefill, decode vs prefill).
"""
from __future__ import annotations

import json

import pytest
import torch

from model.dispatch.table import SCHEMA, TABLE_ENV
from model.moe import EXPERT_PATHS, MoEConfig, select_expert_path
from model.moe.config import PREFILL_IMPLS, TINY_IMPLS
from model.qwen36 import Qwen36Config, Qwen36Model, Qwen36Paths, Qwen36Weights
from model.tolerances import MODEL_DECODE_VS_PREFILL_F32, TRANSFORMERS_MODEL_F32
from tests.numerics.compare import assert_close, relative_error
from tests.numerics.tiny_hf import LAYOUTS, save_tiny_checkpoint

PROMPT_TOKENS = 300  # crosses four 64-token chunks with a ragged tail
NEW_TOKENS = 32
SEED = 0

# MoE config that forces each path the knobs can name, for the token counts where it can run. decode_fused
# serves only T == 1, so with it the prefill takes the default prefill path; every other path serves every
# call. A registered path no knob names is forced by a dispatch table instead (`forced_moe_config`).
FORCED_MOE_PATHS = {
    EXPERT_PATHS.reference.name: MoEConfig(native=False),
    "decode_fused": MoEConfig(decode_native=True, tiny_max=0, prefill_impl="sorted"),
    "tiny_bmm": MoEConfig(decode_native=False, tiny_impl="bmm", tiny_max=4096),
    "tiny_tokenwise": MoEConfig(decode_native=False, tiny_impl="tokenwise", tiny_max=4096),
    "sorted": MoEConfig(decode_native=False, tiny_max=0, prefill_impl="sorted"),
    "grouped_mm": MoEConfig(decode_native=False, tiny_max=0, prefill_impl="grouped_mm"),
    "triton_decode": MoEConfig(decode_native=False, tiny_impl="triton", tiny_max=256),  # its max_tokens
    "triton_grouped": MoEConfig(decode_native=False, tiny_max=0, prefill_impl="triton"),
}


@pytest.fixture(scope="module", params=LAYOUTS)
def tiny(request, tmp_path_factory):
    """(layout, HF model, our weights loaded from the saved checkpoint, prompt, HF logits, HF greedy tokens)."""
    layout = request.param
    directory = tmp_path_factory.mktemp(f"tiny_{layout}")
    hf = save_tiny_checkpoint(layout, directory, seed=SEED)
    weights = Qwen36Weights.from_pretrained_dir(directory)
    prompt = torch.randint(0, weights.config.vocab_size, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        hf_logits = hf(prompt).logits
        hf_tokens = hf.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return layout, hf, weights, prompt, hf_logits, hf_tokens[:, PROMPT_TOKENS:]


def test_every_path_the_knobs_name_is_forced_by_its_knobs():
    knob_paths = {EXPERT_PATHS.reference.name, "decode_fused", *TINY_IMPLS.values(), *PREFILL_IMPLS.values()}
    assert set(FORCED_MOE_PATHS) == knob_paths, "add the path the new knob value names to FORCED_MOE_PATHS"


def forced_moe_config(path: str, tmp_path, monkeypatch) -> MoEConfig:
    """The knobs' config for `path`, or a float32 dispatch table naming it at every token count (the table
    wins wherever the path can run the call; elsewhere the default knobs decide)."""
    if path in FORCED_MOE_PATHS:
        monkeypatch.setenv(TABLE_ENV, "off")  # the knobs alone, whatever table this machine has
        return FORCED_MOE_PATHS[path]
    table = {"schema": SCHEMA, "device": "cpu", "dtype": "float32", "recorded": {},
             "blocks": {"moe_experts": {"keyed_by": "tokens", "ranges": [{"from": 1, "to": None, "path": path}]}}}
    (tmp_path / "forced.json").write_text(json.dumps(table))
    monkeypatch.setenv(TABLE_ENV, str(tmp_path / "forced.json"))  # tables are cached per setting: no stale one
    return MoEConfig()


def test_checkpoint_loads_in_its_own_layout(tiny):
    layout, _, weights, *_ = tiny
    assert weights.config.model_type == {"qwen3_5": "qwen3_5_moe_text", "qwen3_next": "qwen3_next"}[layout]
    assert weights.config.layer_types == ("linear_attention",) * 3 + ("full_attention",)


def test_logits_equal_transformers_float32(tiny):
    layout, _, weights, prompt, hf_logits, _ = tiny
    logits, cache = Qwen36Model(weights)(prompt)
    assert cache.length == PROMPT_TOKENS
    assert_close(logits, hf_logits, TRANSFORMERS_MODEL_F32, f"{layout}: logits over {PROMPT_TOKENS} tokens vs transformers")


def test_float64_reference_model_is_near_transformers_float32(tiny):
    """Our all-reference float64 model (recurrent GDN, written-out attention, float64 experts) lands within
    float32 rounding of transformers: the references themselves compute HF's function."""
    layout, _, weights, prompt, hf_logits, _ = tiny
    ref_logits, _ = Qwen36Model(weights.to(torch.float64), Qwen36Paths.reference())(prompt[:, :130])
    assert_close(hf_logits[:, :130], ref_logits, TRANSFORMERS_MODEL_F32, f"{layout}: HF float32 vs our float64 reference")


def test_greedy_tokens_equal_transformers(tiny):
    layout, _, weights, prompt, _, hf_tokens = tiny
    ours = Qwen36Model(weights).generate(prompt, NEW_TOKENS)
    assert ours.tolist() == hf_tokens.tolist(), f"{layout}: greedy tokens differ from transformers"


@pytest.mark.parametrize("path", sorted(EXPERT_PATHS))
def test_every_moe_path_gives_the_transformers_greedy_tokens(tiny, path, tmp_path, monkeypatch):
    layout, _, weights, prompt, _, hf_tokens = tiny
    if not EXPERT_PATHS[path].supports(1, torch.float32, "cpu"):
        pytest.skip(f"{path} is not available for float32 on this CPU build")
    config = forced_moe_config(path, tmp_path, monkeypatch)
    # The config really routes to the path: every decode step, and the prefill where the path can serve it.
    assert select_expert_path(1, config, "cpu", torch.float32) == path
    if EXPERT_PATHS[path].supports(PROMPT_TOKENS, torch.float32, "cpu"):
        assert select_expert_path(PROMPT_TOKENS, config, "cpu", torch.float32) == path
    ours = Qwen36Model(weights, Qwen36Paths(moe=config)).generate(prompt, NEW_TOKENS)
    assert ours.tolist() == hf_tokens.tolist(), f"{layout}: greedy tokens with MoE path {path} differ from transformers"


def test_chunked_prefill_generation_equals_one_pass(tiny):
    """Prefill in chunks of 50 (state handed over between chunks) then decode: the same greedy tokens."""
    layout, _, weights, prompt, _, hf_tokens = tiny
    ours = Qwen36Model(weights).generate(prompt, NEW_TOKENS, prefill_chunk=50)
    assert ours.tolist() == hf_tokens.tolist(), f"{layout}: chunked-prefill greedy tokens differ"


def test_cached_decode_logits_equal_prefill_logits(tiny):
    """A prefill of 200 tokens then 8 single-token steps gives the logits a 208-token prefill gives."""
    layout, _, weights, prompt, *_ = tiny
    model = Qwen36Model(weights)
    full, _ = model(prompt[:, :208])
    _, cache = model(prompt[:, :200])
    steps = []
    for t in range(200, 208):
        logits, cache = model(prompt[:, t : t + 1], cache)
        steps.append(logits)
    err = relative_error(torch.cat(steps, 1), full[:, 200:])
    assert err <= MODEL_DECODE_VS_PREFILL_F32, f"{layout}: decode vs prefill logits, relative error {err:.2e}"


def test_config_errors_name_the_field():
    from model.qwen36 import ConfigError

    with pytest.raises(ConfigError, match="norm_topk_prob"):
        Qwen36Config.from_hf_dict({"model_type": "qwen3_next", "norm_topk_prob": False})
    with pytest.raises(ConfigError, match="model_type"):
        Qwen36Config.from_hf_dict({"model_type": "llama"})
