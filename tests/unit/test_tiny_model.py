"""The tiny model builder: deterministic bytes, the CPU kernel constraints, the tokenizer and template."""
from __future__ import annotations

import json

import pytest

from harness.errors import HarnessError
from harness.serving.tiny_model import SPECIAL_TOKENS, TinyRecipe, build_tiny_model, checkpoint_digest, tensor_shapes


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-a"))


def test_same_seed_gives_the_same_bytes_for_every_file(built, tmp_path):
    again = build_tiny_model(tmp_path / "tiny-b")
    assert checkpoint_digest(again) == checkpoint_digest(built)


def test_other_seed_changes_the_weights_only(built, tmp_path):
    other = checkpoint_digest(build_tiny_model(tmp_path / "tiny-c", TinyRecipe.load(seed=1)))
    base = checkpoint_digest(built)
    assert other["model.safetensors"] != base["model.safetensors"]
    assert other["chat_template.jinja"] == base["chat_template.jinja"]


def test_config_meets_the_vllm_cpu_kernel_constraints(built):
    cfg = json.loads((built / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3NextForCausalLM"]
    assert cfg["head_dim"] == 64  # 16 is rejected by the CPU attention kernel
    assert cfg["linear_key_head_dim"] == cfg["linear_value_head_dim"] == 128  # 32 is rejected by CPU GDN
    assert cfg["torch_dtype"] == "bfloat16"
    assert cfg["layer_types"].count("full_attention") == 1 and len(cfg["layer_types"]) == 4


def test_weights_have_the_qwen3_next_layout_in_bf16(built):
    from safetensors.torch import load_file

    import torch

    tensors = load_file(str(built / "model.safetensors"))
    shapes = tensor_shapes(TinyRecipe.load())
    assert {k: tuple(v.shape) for k, v in tensors.items()} == shapes
    assert all(v.dtype == torch.bfloat16 for v in tensors.values())
    assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in tensors
    assert "model.layers.3.self_attn.q_proj.weight" in tensors  # the attention layer: query + gate
    assert all(v.float().abs().sum() > 0 for k, v in tensors.items())  # no all-zero tensor


def test_transformers_loads_the_checkpoint_without_missing_or_unexpected_keys(built):
    transformers = pytest.importorskip("transformers")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(built), output_loading_info=True)
    assert type(model).__name__ == "Qwen3NextForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_special_tokens_are_single_tokens_and_eos_is_im_end(built):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(built / "tokenizer.json"))
    for t in SPECIAL_TOKENS:
        assert tok.encode(t, add_special_tokens=False).ids == [tok.token_to_id(t)], t
    cfg = json.loads((built / "config.json").read_text())
    assert cfg["eos_token_id"] == tok.token_to_id("<|im_end|>")
    assert tok.get_vocab_size() <= cfg["vocab_size"]


def test_chat_template_renders_tools_and_tool_calls_through_transformers(built):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(built))
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "d",
                                               "parameters": {"type": "object", "properties": {}}}}]
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nbe brief")
    assert "<name>get_weather</name>" in text and "<function=get_weather>" in text
    assert "<parameter=city>\nParis\n</parameter>" in text
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_recipe_with_unknown_key_is_refused_naming_it(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("seed: 0\nhidden_szie: 128\n")
    with pytest.raises(HarnessError, match="hidden_szie"):
        TinyRecipe.load(bad)


def test_every_token_decodes_to_complete_ascii_so_streams_are_not_held_back(built):
    # A lone byte >= 0x80 is incomplete UTF-8: vLLM's detokenizer would hold the stream until it completes.
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(built / "tokenizer.json"))
    for i in range(tok.get_vocab_size()):
        text = tok.decode([i], skip_special_tokens=False)
        assert text and all(32 <= ord(c) < 127 or c in "\n\t" for c in text), (i, text)
