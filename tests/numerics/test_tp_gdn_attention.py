"""TP sharding of the GDN layer and gated attention as vLLM shards them: the sum of rank partials equals the
unsharded block (float64), with per-rank state carried across calls; KV heads replicate when fewer than TP."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from model.attention.layer import AttentionDims
from model.attention.layer import gated_attention
from model.gdn import gdn_layer, qwen35_to_qwen3_next, qwen3_next_to_qwen35
from model.tolerances import TP_GDN_ATTENTION_F64
from model.tp import (
    gated_attention_tp,
    gather_gdn_state,
    gdn_layer_tp,
    kv_heads_for_rank,
    local_gdn_dims,
    shard_attention_weights,
    shard_gdn_state,
    shard_gdn_weights,
    shard_qwen3_next_projections,
)
from tests.numerics.compare import assert_close
from tests.numerics.gdn_attention_cases import TP_GDN, generator, randn, random_attention_weights, random_gdn_state, random_gdn_weights

F64 = torch.float64
SEEDS = st.integers(0, 2**32 - 1)


@pytest.mark.parametrize("tp", [2, 4])
@settings(max_examples=30)
@given(seed=SEEDS, prompt=st.integers(1, 90), steps=st.integers(0, 3))
def test_gdn_tp_sum_of_partials_equals_unsharded_with_state(tp, seed, prompt, steps):
    """A prefill from a random carried state, then decode steps; outputs and gathered states must match."""
    gen = generator(seed)
    w = random_gdn_weights(gen, TP_GDN, F64)
    x = randn(gen, 2, prompt + steps, TP_GDN.hidden_size, dtype=F64)
    state = random_gdn_state(gen, 2, TP_GDN, F64)
    rank_states = shard_gdn_state(state, TP_GDN, tp)
    assert torch.equal(gather_gdn_state(rank_states, TP_GDN).conv, state.conv), "state sharding does not round-trip"
    for start, stop in [(0, prompt)] + [(t, t + 1) for t in range(prompt, prompt + steps)]:
        ref, state = gdn_layer(x[:, start:stop], w, state)
        out, rank_states = gdn_layer_tp(x[:, start:stop], w, tp, rank_states)
        assert_close(out, ref, TP_GDN_ATTENTION_F64, f"GDN TP={tp} tokens [{start}, {stop})")
        gathered = gather_gdn_state(rank_states, TP_GDN)
        assert_close(gathered.conv, state.conv, TP_GDN_ATTENTION_F64, f"GDN TP={tp} conv state")
        assert_close(gathered.recurrent, state.recurrent, TP_GDN_ATTENTION_F64, f"GDN TP={tp} recurrent state")


@pytest.mark.parametrize("tp", [2, 4])
def test_gdn_rank_weights_are_vllm_merged_slices(tp):
    """Rank r holds key heads [r*H/tp, ...) in every q/k/v/z/b/a/conv block, in vLLM's merged order."""
    w = random_gdn_weights(generator(0), TP_GDN, F64)
    d, local = TP_GDN, local_gdn_dims(TP_GDN, tp)
    for r, rank in enumerate(shard_gdn_weights(w, tp)):
        q, k, v, z = rank.in_proj_qkvz.split([local.key_dim, local.key_dim, local.value_dim, local.value_dim])
        assert torch.equal(q, w.in_proj_qkv[r * local.key_dim : (r + 1) * local.key_dim])
        assert torch.equal(k, w.in_proj_qkv[d.key_dim + r * local.key_dim : d.key_dim + (r + 1) * local.key_dim])
        assert torch.equal(v, w.in_proj_qkv[2 * d.key_dim + r * local.value_dim : 2 * d.key_dim + (r + 1) * local.value_dim])
        assert torch.equal(z, w.in_proj_z[r * local.value_dim : (r + 1) * local.value_dim])
        b, a = rank.in_proj_ba.chunk(2)
        assert torch.equal(b, w.in_proj_b[r * local.num_v_heads : (r + 1) * local.num_v_heads])
        assert torch.equal(a, w.in_proj_a[r * local.num_v_heads : (r + 1) * local.num_v_heads])
        assert torch.equal(rank.out_proj, w.out_proj[:, r * local.value_dim : (r + 1) * local.value_dim])
        assert torch.equal(rank.norm, w.norm)


@pytest.mark.parametrize("tp", [2, 4])
def test_qwen3_next_grouped_layout_shards_to_the_same_rank_weights(tp):
    """vLLM shards the fused per-key-head-grouped projection as whole groups per rank; converted with the
    local dims, that is exactly the rank weight of the split (Qwen3.5) layout."""
    w = random_gdn_weights(generator(3), TP_GDN, F64)
    qkvz, ba = qwen35_to_qwen3_next(w.in_proj_qkv, w.in_proj_z, w.in_proj_b, w.in_proj_a, TP_GDN)
    local = local_gdn_dims(TP_GDN, tp)
    for rank, (qkvz_r, ba_r) in zip(shard_gdn_weights(w, tp), shard_qwen3_next_projections(qkvz, ba, TP_GDN, tp)):
        qkv, z, b, a = qwen3_next_to_qwen35(qkvz_r, ba_r, local)
        layer = rank.layer_weights()
        for name, ours, theirs in (("qkv", layer.in_proj_qkv, qkv), ("z", layer.in_proj_z, z),
                                   ("b", layer.in_proj_b, b), ("a", layer.in_proj_a, a)):
            assert torch.equal(ours, theirs), f"rank in_proj_{name} differs between layouts"


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("kv_heads", [1, 2, 4, 8])
@settings(max_examples=8)
@given(seed=SEEDS, prompt=st.integers(1, 40), steps=st.integers(0, 3))
def test_attention_tp_sum_of_partials_equals_unsharded_with_kv_cache(tp, kv_heads, seed, prompt, steps):
    """Includes kv_heads < tp, where vLLM replicates each kv head on tp / kv_heads ranks."""
    d = AttentionDims(hidden_size=32, num_heads=8, num_kv_heads=kv_heads, head_dim=16, rotary_dim=4, rope_theta=1e4)
    gen = generator(seed)
    w = random_attention_weights(gen, d, F64)
    x = randn(gen, 2, prompt + steps, 32, dtype=F64)
    cache, rank_caches = None, None
    for start, stop in [(0, prompt)] + [(t, t + 1) for t in range(prompt, prompt + steps)]:
        ref, cache = gated_attention(x[:, start:stop], w, cache)
        out, rank_caches = gated_attention_tp(x[:, start:stop], w, tp, rank_caches)
        assert_close(out, ref, TP_GDN_ATTENTION_F64, f"attention TP={tp} kv_heads={kv_heads} tokens [{start}, {stop})")


def test_kv_head_replication_follows_vllm_for_the_real_model():
    """16 q heads / 2 kv heads at TP=4: ranks 0,1 hold kv head 0, ranks 2,3 hold kv head 1 (notes section 5)."""
    assert [list(kv_heads_for_rank(r, 4, 2)) for r in range(4)] == [[0], [0], [1], [1]]
    assert [list(kv_heads_for_rank(r, 2, 4)) for r in range(2)] == [[0, 1], [2, 3]]
    d = AttentionDims(hidden_size=32, num_heads=16, num_kv_heads=2, head_dim=8, rotary_dim=2, rope_theta=1e7)
    w = random_attention_weights(generator(0), d, F64)
    ranks = shard_attention_weights(w, 4)
    assert all(r.dims.num_heads == 4 and r.dims.num_kv_heads == 1 for r in ranks)
    assert torch.equal(ranks[1].k_proj, w.k_proj[:8]) and torch.equal(ranks[2].k_proj, w.k_proj[8:])
    assert torch.equal(ranks[3].q_proj, w.q_proj[3 * 4 * 16 :]), "rank 3 holds q+gate rows of heads 12..15"


def test_tp_sizes_that_cannot_shard_are_refused_with_the_dimension_named():
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        kv_heads_for_rank(0, 3, 2)
    with pytest.raises(ValueError, match="linear_num_key_heads=4 is not divisible by tp_size=3"):
        local_gdn_dims(TP_GDN, 3)
