"""The sparse MoE block (router + dispatched experts + gated shared expert) equals the float64 block."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from model.moe import MoEConfig, moe_block, moe_block_reference
from model import tolerances
from tests.numerics.compare import assert_close, cpu_supports
from tests.numerics.moe_cases import MOE_CONFIGS, MoECase, block_reference, make_hidden, make_moe_weights, moe_cases

DTYPES = [torch.float64, torch.float32, torch.bfloat16] + ([torch.float16] if cpu_supports(torch.float16) else [])

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@given(case=moe_cases(tokens=st.integers(1, 40)), config=MOE_CONFIGS, router=st.sampled_from(["reference", "topk_softmax"]))
def test_moe_block_equals_float64_block(dtype, case, config, router):
    if dtype == torch.float64 and config.native and config.prefill_impl == "grouped_mm":
        config = MoEConfig(tiny_impl=config.tiny_impl, tiny_max=config.tiny_max)  # no float64 grouped GEMM
    w = make_moe_weights(case, dtype)
    x = make_hidden(case, dtype)
    out = moe_block(x, w, config, router)
    assert out.dtype == dtype
    ref, scale = block_reference(x, w)
    assert_close(out, ref, tolerances.MOE_BLOCK[dtype], f"block {config} {router}", scale=scale)


def test_moe_block_routing_from_float64_logits_matches_when_no_near_ties():
    """Without a given routing, the reference routes from float64 logits: same decision in float32 here."""
    case = MoECase(tokens=32, experts=16, top_k=4, hidden=32, intermediate=16, shared_intermediate=24, pattern="random", seed=5)
    w = make_moe_weights(case, torch.float32)
    x = make_hidden(case, torch.float32)
    assert_close(moe_block(x, w), moe_block_reference(x, w), tolerances.MOE_BLOCK[torch.float32], "block")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_moe_block_non_finite_hidden_state_propagates_to_its_token_only(bad, tokens):
    case = MoECase(tokens, experts=8, top_k=2, hidden=16, intermediate=8, shared_intermediate=8, pattern="random", seed=9)
    w = make_moe_weights(case, torch.float32)
    x = make_hidden(case, torch.float32)
    x[0, 1] = bad
    out = moe_block(x, w)
    assert not torch.isfinite(out[0]).any(), f"a {bad} hidden state was masked: {out[0]}"
    assert torch.isfinite(out[1:]).all()
