"""Gated full attention: attention cores equal the reference, prefill over a cached prefix equals full
recomputation, decode steps equal prefill, and the layer and RoPE equal transformers' on the same weights."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from model.attention.layer import ATTENTION_CORES, AttentionDims, KVCache, gated_attention
from model.attention.rope import apply_partial_rope, rope_cos_sin
from model.tolerances import ATTENTION_CORES as CORE_TOLERANCES, ATTENTION_PREFIX
from tests.numerics.compare import assert_close, cpu_supports
from tests.numerics.gdn_attention_cases import TINY_ATTENTION, generator, randn, random_attention_weights

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
DTYPES = [d for d in (F64, F32, BF16) if cpu_supports(d)]
SEEDS = st.integers(0, 2**32 - 1)


def test_every_attention_core_has_a_tolerance():
    assert not set(ATTENTION_CORES) - set(CORE_TOLERANCES)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(ATTENTION_CORES))
@settings(max_examples=40)
@given(seed=SEEDS, prefix=st.integers(0, 40), tokens=st.integers(1, 40), kv_heads=st.sampled_from([1, 2, 4]))
def test_attention_core_equals_reference(name, dtype, seed, prefix, tokens, kv_heads):
    gen = generator(seed)
    q = randn(gen, 2, 4, tokens, 16, dtype=dtype)
    k = randn(gen, 2, kv_heads, prefix + tokens, 16, dtype=dtype)
    v = randn(gen, 2, kv_heads, prefix + tokens, 16, dtype=dtype)
    ref = ATTENTION_CORES.reference.fn(q.double(), k.double(), v.double(), prefix, 0.25)
    out = ATTENTION_CORES[name].fn(q, k, v, prefix, 0.25)
    assert out.dtype == dtype
    assert_close(out, ref, CORE_TOLERANCES[name][dtype], f"attention core {name} {dtype} P={prefix} T={tokens}")


@pytest.mark.parametrize("dtype", [F64, F32], ids=str)
@pytest.mark.parametrize("core", sorted(ATTENTION_CORES))
@settings(max_examples=40)
@given(seed=SEEDS, tokens=st.integers(2, 60), data=st.data())
def test_prefix_cached_attention_equals_full_recomputation(core, dtype, seed, tokens, data):
    prefix = data.draw(st.integers(1, tokens - 1), label="prefix")
    gen = generator(seed)
    w = random_attention_weights(gen, TINY_ATTENTION, dtype)
    x = randn(gen, 2, tokens, TINY_ATTENTION.hidden_size, dtype=dtype)
    full, full_cache = gated_attention(x, w, core=core)
    _, cache = gated_attention(x[:, :prefix], w, core=core)
    rest, end_cache = gated_attention(x[:, prefix:], w, cache, core=core)
    bound = ATTENTION_PREFIX[dtype]
    assert_close(rest, full[:, prefix:], bound, f"{core}: tokens after a cached prefix of {prefix}/{tokens}")
    assert_close(end_cache.k, full_cache.k, bound, "cached keys")
    assert_close(end_cache.v, full_cache.v, bound, "cached values")


@settings(max_examples=30)
@given(seed=SEEDS, prompt=st.integers(1, 30), steps=st.integers(1, 6))
def test_attention_decode_steps_equal_prefill(seed, prompt, steps):
    gen = generator(seed)
    w = random_attention_weights(gen, TINY_ATTENTION, F32)
    x = randn(gen, 1, prompt + steps, TINY_ATTENTION.hidden_size)
    full, _ = gated_attention(x, w)
    out, cache = gated_attention(x[:, :prompt], w)
    outs = [out]
    for t in range(prompt, prompt + steps):
        out, cache = gated_attention(x[:, t : t + 1], w, cache)
        outs.append(out)
    assert cache.length == prompt + steps
    assert_close(torch.cat(outs, 1), full, ATTENTION_PREFIX[F32], f"prompt {prompt} + {steps} decode steps")


@settings(max_examples=10)
@given(seed=SEEDS, tokens=st.integers(1, 50), kv_heads=st.sampled_from([1, 2, 4]))
def test_gated_attention_matches_transformers(seed, tokens, kv_heads):
    """Same weights through HF's Qwen3NextAttention (eager): q/gate split, q/k norm, partial RoPE, GQA."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

    d = AttentionDims(hidden_size=32, num_heads=4, num_kv_heads=kv_heads, head_dim=16, rotary_dim=4, rope_theta=1e4)
    config = Qwen3NextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=16, partial_rotary_factor=0.25,
        rope_theta=1e4, num_hidden_layers=1, layer_types=["full_attention"], attn_implementation="eager",
    )
    hf = Qwen3NextAttention(config, 0).eval()
    rotary = Qwen3NextRotaryEmbedding(config)
    gen = generator(seed)
    w = random_attention_weights(gen, d, F32)
    x = randn(gen, 1, tokens, 32)
    with torch.no_grad():
        for name, t in w.to_hf_state_dict().items():
            hf.get_parameter(name).copy_(t)
        position_embeddings = rotary(x, torch.arange(tokens)[None])
        mask = torch.full((tokens, tokens), float("-inf")).triu(1)[None, None]
        ref, _ = hf(x, position_embeddings=position_embeddings, attention_mask=mask)
    ours, _ = gated_attention(x, w)
    assert_close(ours, ref, 1e-5, f"gated attention vs transformers, T={tokens}, {kv_heads} kv heads")


def test_partial_rope_rotates_only_the_first_rotary_dims_in_neox_pairs():
    x = randn(generator(0), 1, 1, 3, 16, dtype=F64)
    cos, sin = rope_cos_sin(torch.arange(3), 4, 1e4, F64)
    y = apply_partial_rope(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:]), "dims past rotary_dim must pass through"
    assert torch.equal(y[..., 0, :], x[..., 0, :]), "position 0 is the identity rotation"
    # Pair (i, i + rotary_dim/2) rotates as a 2-D vector by angle pos * inv_freq_i: norms are preserved.
    for i in range(2):
        pair = lambda t: torch.stack([t[..., i], t[..., i + 2]], -1).norm(dim=-1)  # noqa: E731
        assert torch.allclose(pair(y), pair(x))


def test_kv_cache_of_another_batch_is_rejected():
    w = random_attention_weights(generator(0), TINY_ATTENTION, F32)
    cache = KVCache.empty(3, TINY_ATTENTION, F32)
    with pytest.raises(ValueError, match="holds 3 sequences"):
        gated_attention(randn(generator(1), 2, 4, 32), w, cache)
