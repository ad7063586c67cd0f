"""Build a deterministic tiny random Qwen3-Next checkpoint that vLLM's CPU build can serve.

Same recipe and seed give the same bytes: every tensor is drawn from its own generator seeded by
(seed, tensor name), so neither the order of construction nor library init code changes the weights, and
the tokenizer is trained on a corpus generated from the same seed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.errors import HarnessError
from harness.paths import TINY_MODEL_CHAT_TEMPLATE, TINY_MODEL_RECIPE

# The special tokens of Qwen chat; the qwen3 reasoning parser and qwen3_coder tool parser look them up as
# single tokens in the vocabulary.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


@dataclass(frozen=True)
class TinyRecipe:
    seed: int
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    full_attention_interval: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    max_position_embeddings: int
    rope_theta: float
    partial_rotary_factor: float
    rms_norm_eps: float
    initializer_range: float

    @classmethod
    def load(cls, path: Path = TINY_MODEL_RECIPE, **overrides: object) -> "TinyRecipe":
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise HarnessError(f"tiny-model recipe {path}: cannot read ({exc}); restore it from git") from exc
        raw.update({k: v for k, v in overrides.items() if v is not None})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - names)
        missing = sorted(names - set(raw))
        if unknown or missing:
            raise HarnessError(
                f"tiny-model recipe {path}: unknown keys {unknown}, missing keys {missing}; "
                f"the keys are {sorted(names)}"
            )
        return cls(**raw)

    def layer_types(self) -> list[str]:
        # Same rule as Qwen3-Next: every `full_attention_interval`-th layer is full attention.
        return [
            "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
            for i in range(self.num_hidden_layers)
        ]

    def hf_config(self, eos_id: int, pad_id: int) -> dict:
        return {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "torch_dtype": "bfloat16",
            "dtype": "bfloat16",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": False,
            "rope_theta": self.rope_theta,
            "partial_rotary_factor": self.partial_rotary_factor,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
            "attention_bias": False,
            "attention_dropout": 0.0,
            "full_attention_interval": self.full_attention_interval,
            "layer_types": self.layer_types(),
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "norm_topk_prob": True,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
            "bos_token_id": None,
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
            "use_cache": True,
        }


def tensor_shapes(r: TinyRecipe) -> dict[str, tuple[int, ...]]:
    """HF Qwen3-Next checkpoint layout (per-expert MoE weights, fused `in_proj_qkvz` / `in_proj_ba`)."""
    H = r.hidden_size
    key_dim = r.linear_num_key_heads * r.linear_key_head_dim
    value_dim = r.linear_num_value_heads * r.linear_value_head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (r.vocab_size, H),
        "model.norm.weight": (H,),
        "lm_head.weight": (r.vocab_size, H),
    }
    for i, kind in enumerate(r.layer_types()):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        if kind == "linear_attention":
            a = p + "linear_attn."
            shapes[a + "in_proj_qkvz.weight"] = (2 * key_dim + 2 * value_dim, H)
            shapes[a + "in_proj_ba.weight"] = (2 * r.linear_num_value_heads, H)
            shapes[a + "conv1d.weight"] = (2 * key_dim + value_dim, 1, r.linear_conv_kernel_dim)
            shapes[a + "dt_bias"] = (r.linear_num_value_heads,)
            shapes[a + "A_log"] = (r.linear_num_value_heads,)
            shapes[a + "norm.weight"] = (r.linear_value_head_dim,)
            shapes[a + "out_proj.weight"] = (H, value_dim)
        else:
            a = p + "self_attn."
            # q_proj yields the query and a per-head output gate, hence twice the width.
            shapes[a + "q_proj.weight"] = (2 * r.num_attention_heads * r.head_dim, H)
            shapes[a + "k_proj.weight"] = (r.num_key_value_heads * r.head_dim, H)
            shapes[a + "v_proj.weight"] = (r.num_key_value_heads * r.head_dim, H)
            shapes[a + "o_proj.weight"] = (H, r.num_attention_heads * r.head_dim)
            shapes[a + "q_norm.weight"] = (r.head_dim,)
            shapes[a + "k_norm.weight"] = (r.head_dim,)
        m = p + "mlp."
        shapes[m + "gate.weight"] = (r.num_experts, H)
        for e in range(r.num_experts):
            shapes[m + f"experts.{e}.gate_proj.weight"] = (r.moe_intermediate_size, H)
            shapes[m + f"experts.{e}.up_proj.weight"] = (r.moe_intermediate_size, H)
            shapes[m + f"experts.{e}.down_proj.weight"] = (H, r.moe_intermediate_size)
        I = r.shared_expert_intermediate_size
        shapes[m + "shared_expert.gate_proj.weight"] = (I, H)
        shapes[m + "shared_expert.up_proj.weight"] = (I, H)
        shapes[m + "shared_expert.down_proj.weight"] = (H, I)
        shapes[m + "shared_expert_gate.weight"] = (1, H)
    return shapes


def _generator(seed: int, name: str):
    import torch

    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def random_weights(r: TinyRecipe) -> dict:
    """bf16 tensors; norms are small random offsets (zero-centred norms: weight 0 means scale 1) so that
    a path that ignored a norm weight would change the output."""
    import torch

    out = {}
    for name, shape in tensor_shapes(r).items():
        g = _generator(r.seed, name)
        if name.endswith("A_log"):
            t = torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=g))
        elif name.endswith("dt_bias"):
            t = torch.ones(shape) + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("linear_attn.norm.weight"):
            t = torch.ones(shape) + 0.1 * torch.randn(shape, generator=g)  # plain-weight RMSNorm
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            t = 0.1 * torch.randn(shape, generator=g)  # zero-centred RMSNorm: x_hat * (1 + w)
        else:
            t = r.initializer_range * torch.randn(shape, generator=g)
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


_WORDS = (
    "the a an of to in and or is are was be for with on at by from as that this it not you we they "
    "model server request response token tokens stream cache prefix decode prefill expert router layer "
    "attention linear state weight bias norm gate value key query head batch throughput latency city "
    "weather search file read write path line code function call tool result error status time date "
    "user assistant system message content json string number integer boolean array object name type "
    "description parameters properties required query limit offset page sort order id uuid hello world "
    "please could would should will can may one two three four five six seven eight nine ten zero"
).split()


def tokenizer_corpus(seed: int, lines: int = 4000) -> list[str]:
    """Deterministic text covering prose, JSON and the Qwen chat / tool-call markup."""
    rng = random.Random(seed)
    corpus = []
    for i in range(lines):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 24)))
        kind = i % 4
        if kind == 0:
            corpus.append(words.capitalize() + ".")
        elif kind == 1:
            args = {rng.choice(_WORDS): rng.choice(_WORDS) for _ in range(rng.randint(1, 3))}
            corpus.append(json.dumps({"name": rng.choice(_WORDS), "arguments": args}))
        elif kind == 2:
            corpus.append(
                f"<function={rng.choice(_WORDS)}_{rng.choice(_WORDS)}>\n<parameter={rng.choice(_WORDS)}>\n"
                f"{words}\n</parameter>\n</function>"
            )
        else:
            corpus.append(f"def {rng.choice(_WORDS)}_{i}({rng.choice(_WORDS)}):\n    return {rng.randint(0, 9999)}")
    return corpus


# Byte-level symbols of printable ASCII plus space, newline and tab ('Ġ', 'Ċ', 'ĉ' in GPT-2's byte map).
# Why not all 256 bytes: a random model samples lone bytes >= 0x80, which are incomplete UTF-8, and vLLM's
# incremental detokenizer then holds back the stream until the end, so every token would arrive at once.
ASCII_ALPHABET = [chr(b) for b in range(33, 127)] + ["Ġ", "Ċ", "ĉ"]


def train_tokenizer(seed: int, vocab_size: int):
    """Byte-level BPE over an ASCII alphabet, with the Qwen chat special tokens at the lowest ids.
    Characters outside the alphabet are dropped when encoding (acceptable for a random test model)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=ASCII_ALPHABET,
        limit_alphabet=len(ASCII_ALPHABET),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(seed), trainer=trainer)
    return tok


def build_tiny_model(out_dir: Path, recipe: TinyRecipe | None = None) -> Path:
    """Write the checkpoint, tokenizer and chat template into `out_dir`; returns `out_dir`."""
    from safetensors.torch import save_file

    recipe = recipe or TinyRecipe.load()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer(recipe.seed, recipe.vocab_size)
    if tok.get_vocab_size() > recipe.vocab_size:
        raise HarnessError(
            f"tiny-model tokenizer has {tok.get_vocab_size()} tokens, more than vocab_size "
            f"{recipe.vocab_size}; raise vocab_size in {TINY_MODEL_RECIPE}"
        )
    eos_id = tok.token_to_id(EOS_TOKEN)
    pad_id = tok.token_to_id(PAD_TOKEN)
    tok.save(str(out_dir / "tokenizer.json"))
    chat_template = TINY_MODEL_CHAT_TEMPLATE.read_text()
    (out_dir / "chat_template.jinja").write_text(chat_template)
    # Written by hand rather than by transformers' save_pretrained so the bytes do not depend on its version.
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": recipe.max_position_embeddings,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "bos_token": None,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {
                "content": t, "lstrip": False, "rstrip": False, "normalized": False,
                "single_word": False, "special": True,
            }
            for t in SPECIAL_TOKENS
        },
        "chat_template": chat_template,
    }
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
    _write_json(out_dir / "config.json", recipe.hf_config(eos_id, pad_id))
    _write_json(
        out_dir / "generation_config.json",
        {"eos_token_id": [eos_id, pad_id], "pad_token_id": pad_id, "do_sample": False},
    )
    save_file(random_weights(recipe), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def checkpoint_digest(model_dir: Path) -> dict[str, str]:
    """sha256 of every file the builder writes: the identity of a tiny model in manifests and tests."""
    return {name: hashlib.sha256((Path(model_dir) / name).read_bytes()).hexdigest() for name in FILES}


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
