"""Our MoE reference agrees with code nobody here wrote: HF transformers' Qwen3.5-MoE and Qwen3-Next blocks.

Same random weights (loaded through `MoEWeights.from_hf_state_dict`, so the layout mapping is checked too).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from model.moe import MoEConfig, MoEWeights, moe_block, moe_block_reference
from model import tolerances
from tests.numerics.compare import assert_close

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency: make test installs it")


def hf_block(kind: str, hidden: int, experts: int, top_k: int, inter: int, shared: int, seed: int, dtype):
    if kind == "qwen3_5_moe":
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig as Config
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock as Block

        extra = {}
    else:
        from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig as Config
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock as Block

        extra = {"norm_topk_prob": True}  # Qwen3-Next's released config; Qwen3.5 always renormalises
    config = Config(
        hidden_size=hidden,
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=inter,
        shared_expert_intermediate_size=shared,
        hidden_act="silu",
        **extra,
    )
    config._experts_implementation = "eager"  # HF's own per-expert loop, not a kernel we might share
    torch.manual_seed(seed)
    block = Block(config).to(dtype)
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0.0, param.shape[-1] ** -0.5)
    return block.eval()


hf_cases = st.fixed_dictionaries(
    {
        "hidden": st.integers(4, 48),
        "experts": st.integers(2, 32),
        "inter": st.integers(1, 32),
        "shared": st.integers(1, 32),
        "tokens": st.integers(1, 64),
        "seed": st.integers(0, 2**16),
    }
)


@pytest.mark.parametrize("kind", ["qwen3_5_moe", "qwen3_next"])
@settings(max_examples=25)
@given(case=hf_cases, k_fraction=st.floats(0, 1))
def test_our_block_equals_transformers_block(kind, case, k_fraction):
    top_k = 1 + int(k_fraction * (min(case["experts"], 8) - 1))
    results = {}
    for dtype in (torch.float64, torch.float32):
        block = hf_block(kind, case["hidden"], case["experts"], top_k, case["inter"], case["shared"], case["seed"], dtype)
        weights = MoEWeights.from_hf_state_dict(block.state_dict(), top_k=top_k)
        x = torch.randn(1, case["tokens"], case["hidden"], generator=torch.Generator().manual_seed(case["seed"])).to(dtype)
        with torch.no_grad():
            results[dtype] = (block(x)[0], weights, x[0])
    hf64, w64, x64 = results[torch.float64]
    # The float64 reference against HF in float64 (HF routes in float32 like us): only summation order differs.
    assert_close(moe_block_reference(x64, w64), hf64, 1e-12, f"{kind} reference vs transformers (float64)")
    # Our optimised block in float32 against HF in float32.
    hf32, w32, x32 = results[torch.float32]
    assert_close(moe_block(x32, w32, MoEConfig()), hf32, tolerances.TRANSFORMERS_MOE_F32, f"{kind} block vs transformers (float32)")


def test_hf_state_dict_missing_key_is_named():
    block = hf_block("qwen3_5_moe", 8, 4, 2, 4, 4, 0, torch.float32)
    state = block.state_dict()
    del state["experts.down_proj"]
    with pytest.raises(KeyError, match="experts.down_proj"):
        MoEWeights.from_hf_state_dict(state, top_k=2)


def test_per_expert_checkpoint_keys_load_as_the_fused_layout():
    """On disk, HF stores experts as `experts.{e}.{gate,up,down}_proj.weight`; both layouts load the same."""
    block = hf_block("qwen3_5_moe", 8, 4, 2, 3, 4, 0, torch.float32)
    fused = block.state_dict()
    per_expert = {k: v for k, v in fused.items() if not k.startswith("experts.")}
    inter = fused["experts.down_proj"].shape[2]
    for e in range(4):
        per_expert[f"experts.{e}.gate_proj.weight"] = fused["experts.gate_up_proj"][e, :inter]
        per_expert[f"experts.{e}.up_proj.weight"] = fused["experts.gate_up_proj"][e, inter:]
        per_expert[f"experts.{e}.down_proj.weight"] = fused["experts.down_proj"][e]
    a = MoEWeights.from_hf_state_dict(fused, top_k=2)
    b = MoEWeights.from_hf_state_dict(per_expert, top_k=2)
    assert all(torch.equal(a.tensors()[k], b.tensors()[k]) for k in a.tensors())
    del per_expert["experts.3.down_proj.weight"]
    with pytest.raises(KeyError, match=r"experts.3.down_proj.weight"):
        MoEWeights.from_hf_state_dict(per_expert, top_k=2)
