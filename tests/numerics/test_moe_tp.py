"""MoE sharded as vLLM shards it for TP (2, 4, 8), rank partials summed, equals the unsharded block."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from model.moe import MoEConfig, moe_block
from model.tp import moe_block_tp, shard_moe_weights
from model import tolerances
from tests.numerics.compare import assert_close
from tests.numerics.moe_cases import MoECase, block_reference, make_hidden, make_moe_weights, moe_cases

TP_SIZES = [2, 4, 8]


def tp_cases(tp: int):
    # Intermediate sizes that TP can split: a multiple of tp (vLLM requires it too).
    return moe_cases(
        tokens=st.integers(1, 40),
        intermediate=st.integers(1, 6).map(lambda m: m * tp),
        shared_intermediate=st.integers(1, 6).map(lambda m: m * tp),
    )


@pytest.mark.parametrize("tp", TP_SIZES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=lambda d: str(d).removeprefix("torch."))
@given(data=st.data())
def test_sharded_moe_block_equals_unsharded(tp, dtype, data):
    case = data.draw(tp_cases(tp))
    config = MoEConfig(tiny_max=data.draw(st.integers(0, 8)))
    w = make_moe_weights(case, dtype)
    x = make_hidden(case, dtype)
    sharded = moe_block_tp(x, w, tp, config)
    ref, scale = block_reference(x, w)  # every rank routes from the same replicated logits
    assert_close(sharded, ref, tolerances.MOE_BLOCK[dtype], f"TP={tp} vs float64 unsharded", scale=scale)
    if dtype == torch.float64:
        # In float64, sharding itself must be exact up to summation order.
        assert_close(sharded, moe_block(x, w, config), 1e-12, f"TP={tp} vs unsharded float64")


@pytest.mark.parametrize("tp", TP_SIZES)
def test_shards_have_vllm_shapes_and_reassemble_the_full_weights(tp):
    case = MoECase(3, experts=6, top_k=2, hidden=16, intermediate=2 * tp, shared_intermediate=3 * tp, pattern="random", seed=0)
    w = make_moe_weights(case, torch.float32)
    ranks = shard_moe_weights(w, tp)
    inter, shared = case.intermediate // tp, case.shared_intermediate // tp
    for r in ranks:
        assert r.w13.shape == (6, 2 * inter, 16) and r.w2.shape == (6, 16, inter)
        assert r.shared_w1.shape == (shared, 16) and r.shared_w2.shape == (16, shared)
        assert r.router is w.router and r.shared_gate is w.shared_gate  # replicated, not copied
    gate = torch.cat([r.w13[:, :inter] for r in ranks], dim=1)
    up = torch.cat([r.w13[:, inter:] for r in ranks], dim=1)
    assert torch.equal(torch.cat([gate, up], dim=1), w.w13)  # each half split contiguously, as _load_w13
    assert torch.equal(torch.cat([r.w2 for r in ranks], dim=2), w.w2)
    assert torch.equal(torch.cat([r.shared_w1 for r in ranks]), w.shared_w1)
    assert torch.equal(torch.cat([r.shared_w2 for r in ranks], dim=1), w.shared_w2)


def test_tp_size_that_does_not_divide_the_intermediate_size_is_rejected():
    case = MoECase(1, experts=2, top_k=1, hidden=8, intermediate=6, shared_intermediate=8, pattern="random", seed=0)
    with pytest.raises(ValueError, match="moe_intermediate_size=6 is not divisible by tp_size=4"):
        shard_moe_weights(make_moe_weights(case, torch.float32), 4)
