"""The GDN layer's state hand-over, its two projection layouts, and a deliberately broken hand-over.

The hand-over properties are written once, as property factories taking the layer function, so the same
checker runs on the real layer (must pass) and on broken variants (must fail with a shrunk counterexample).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from model.gdn import GDNState, GDNWeights, gdn_layer, qwen35_to_qwen3_next, qwen3_next_to_qwen35
from tests.numerics.compare import assert_close
from tests.numerics.gdn_attention_cases import TINY_GDN, generator, randn, random_gdn_state, random_gdn_weights
from model.tolerances import GDN_HANDOVER, GDN_LAYER

F64, F32 = torch.float64, torch.float32
SEEDS = st.integers(0, 2**32 - 1)


def layer_case(seed: int, batch: int, tokens: int, dtype: torch.dtype):
    gen = generator(seed)
    w = random_gdn_weights(gen, TINY_GDN, dtype)
    x = randn(gen, batch, tokens, TINY_GDN.hidden_size, dtype=dtype)
    return w, x, random_gdn_state(gen, batch, TINY_GDN, dtype)


def assert_states_close(a: GDNState, b: GDNState, bound: float, what: str) -> None:
    assert_close(a.conv, b.conv, bound, f"{what}: conv state")
    assert_close(a.recurrent, b.recurrent, bound, f"{what}: recurrent state")


# --- the property checkers ----------------------------------------------------------------------------

def split_prefill_property(layer, max_examples: int, failures: list | None = None, **hypothesis_settings):
    """A prefill split at any point, with the state handed over, equals one pass (outputs and state)."""

    @settings(max_examples=max_examples, **hypothesis_settings)
    @given(seed=SEEDS, tokens=st.integers(2, 140), data=st.data())
    def check(seed, tokens, data):
        split = data.draw(st.integers(1, tokens - 1), label="split")
        w, x, state = layer_case(seed, 1, tokens, F32)
        whole, whole_state = gdn_layer(x, w, state)
        first, mid = layer(x[:, :split], w, state)
        second, end = layer(x[:, split:], w, mid)
        try:
            assert_close(torch.cat([first, second], 1), whole, GDN_HANDOVER[F32], f"split {split}/{tokens}: output")
            assert_states_close(end, whole_state, GDN_HANDOVER[F32], f"split {split}/{tokens}")
        except AssertionError:
            if failures is not None:
                failures.append({"seed": seed, "tokens": tokens, "split": split})
            raise

    return check


def decode_steps_property(layer, max_examples: int, failures: list | None = None, **hypothesis_settings):
    """N decode steps (conv update + decode_step), each handing its state to the next, equal one prefill."""

    @settings(max_examples=max_examples, **hypothesis_settings)
    @given(seed=SEEDS, prompt=st.integers(1, 70), steps=st.integers(1, 8))
    def check(seed, prompt, steps):
        w, x, state = layer_case(seed, 2, prompt + steps, F32)
        whole, whole_state = gdn_layer(x, w, state)
        out, state = layer(x[:, :prompt], w, state)
        outs = [out]
        for t in range(prompt, prompt + steps):
            out, state = layer(x[:, t : t + 1], w, state)
            outs.append(out)
        try:
            assert_close(torch.cat(outs, 1), whole, GDN_HANDOVER[F32], f"prompt {prompt} + {steps} decode steps")
            assert_states_close(state, whole_state, GDN_HANDOVER[F32], f"prompt {prompt} + {steps} decode steps")
        except AssertionError:
            if failures is not None:
                failures.append({"seed": seed, "prompt": prompt, "steps": steps})
            raise

    return check


# --- the real layer passes ---------------------------------------------------------------------------

def test_gdn_layer_split_prefill_with_state_handover_equals_one_pass():
    split_prefill_property(gdn_layer, max_examples=60)()


def test_gdn_layer_decode_steps_equal_prefill():
    decode_steps_property(gdn_layer, max_examples=40)()


@pytest.mark.parametrize("rule,conv", [("chunked", "prefill"), ("decode_step", "update")])
@settings(max_examples=25)
@given(seed=SEEDS, tokens=st.integers(1, 100))
def test_gdn_layer_equals_float64_reference_layer(rule, conv, seed, tokens):
    """The serving paths in float32 against the all-reference layer in float64 (same weights and state)."""
    if rule == "decode_step":
        tokens = 1
    w, x, state = layer_case(seed, 2, tokens, F32)
    ref, ref_state = gdn_layer(
        x.double(), w.to(F64), GDNState(state.conv.double(), state.recurrent.double()),
        rule="recurrent_reference", conv="reference", norm="reference",
    )
    out, new_state = gdn_layer(x, w, state, rule=rule, conv=conv)
    assert_close(out, ref, GDN_LAYER[F32], f"GDN layer ({rule}) T={tokens}")
    assert_states_close(new_state, ref_state, GDN_LAYER[F32], f"GDN layer ({rule}) T={tokens}")


# --- broken hand-overs are caught ----------------------------------------------------------------------

def layer_dropping_conv_state(x, w, state=None, **paths):
    """Broken on purpose: starts every call from a zero conv window (the recurrent state is kept)."""
    if state is not None:
        state = replace(state, conv=torch.zeros_like(state.conv))
    return gdn_layer(x, w, state, **paths)


def layer_resetting_recurrent_state(x, w, state=None, **paths):
    """Broken on purpose: starts every call from a zero recurrent state (the conv window is kept)."""
    if state is not None:
        state = replace(state, recurrent=torch.zeros_like(state.recurrent))
    return gdn_layer(x, w, state, **paths)


# The broken properties fail by design: no example database (a stored failure would replay elsewhere),
# derandomised so the shrunk counterexample is reproducible.
BROKEN_SETTINGS = dict(database=None, derandomize=True, suppress_health_check=list(HealthCheck),
                       phases=[Phase.explicit, Phase.generate, Phase.shrink])


def _run_expecting_falsification(check, failures):
    with pytest.raises(AssertionError) as info:
        check()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    # The wording changed across hypothesis versions ("Falsifying example" -> "Failing test case").
    assert "Falsifying example" in notes or "Failing test case" in notes, f"no counterexample reported:\n{notes}"
    assert failures, "the property failed without recording its counterexample"
    return failures[-1], notes  # hypothesis replays the shrunk example last


@pytest.mark.parametrize("broken", [layer_dropping_conv_state, layer_resetting_recurrent_state], ids=lambda f: f.__name__)
def test_split_prefill_checker_catches_broken_handover_with_a_shrunk_counterexample(broken):
    failures: list = []
    shrunk, notes = _run_expecting_falsification(
        split_prefill_property(broken, max_examples=30, failures=failures, **BROKEN_SETTINGS), failures
    )
    # Any split of any sequence exposes a lost state; the shrinker must get to the smallest one.
    assert shrunk == {"seed": 0, "tokens": 2, "split": 1}, f"counterexample not shrunk to minimal: {shrunk}\n{notes}"


@pytest.mark.parametrize("broken", [layer_dropping_conv_state, layer_resetting_recurrent_state], ids=lambda f: f.__name__)
def test_decode_steps_checker_catches_broken_handover_with_a_shrunk_counterexample(broken):
    failures: list = []
    shrunk, notes = _run_expecting_falsification(
        decode_steps_property(broken, max_examples=30, failures=failures, **BROKEN_SETTINGS), failures
    )
    assert shrunk == {"seed": 0, "prompt": 1, "steps": 1}, f"counterexample not shrunk to minimal: {shrunk}\n{notes}"


# --- the two projection layouts ---------------------------------------------------------------------

@settings(max_examples=10)
@given(seed=SEEDS)
def test_qwen3_next_layout_round_trip_is_exact(seed):
    w = random_gdn_weights(generator(seed), TINY_GDN, F32)
    qkvz, ba = qwen35_to_qwen3_next(w.in_proj_qkv, w.in_proj_z, w.in_proj_b, w.in_proj_a, TINY_GDN)
    back = qwen3_next_to_qwen35(qkvz, ba, TINY_GDN)
    for name, original, converted in zip(("qkv", "z", "b", "a"), (w.in_proj_qkv, w.in_proj_z, w.in_proj_b, w.in_proj_a), back):
        assert torch.equal(original, converted), f"in_proj_{name} changed in the round trip"
    # The fused layout really is grouped per key head: group 0 starts with q_0 then k_0.
    kd = TINY_GDN.head_k_dim
    assert torch.equal(qkvz[:kd], w.in_proj_qkv[:kd])
    assert torch.equal(qkvz[kd : 2 * kd], w.in_proj_qkv[TINY_GDN.key_dim : TINY_GDN.key_dim + kd])


def test_qwen3_next_layout_matches_transformers_fix_query_key_value_ordering():
    """Our converter splits the fused projection exactly as HF's Qwen3-Next layer does."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    d = TINY_GDN
    config = Qwen3NextConfig(
        hidden_size=d.hidden_size, linear_num_key_heads=d.num_k_heads, linear_num_value_heads=d.num_v_heads,
        linear_key_head_dim=d.head_k_dim, linear_value_head_dim=d.head_v_dim, num_hidden_layers=1,
        layer_types=["linear_attention"],
    )
    hf = Qwen3NextGatedDeltaNet(config, 0)
    gen = generator(1)
    x = randn(gen, 1, 3, d.hidden_size)
    with torch.no_grad():
        hf.in_proj_qkvz.weight.copy_(randn(gen, *hf.in_proj_qkvz.weight.shape))
        hf.in_proj_ba.weight.copy_(randn(gen, *hf.in_proj_ba.weight.shape))
        q, k, v, z, b, a = hf.fix_query_key_value_ordering(hf.in_proj_qkvz(x), hf.in_proj_ba(x))
    qkv_w, z_w, b_w, a_w = qwen3_next_to_qwen35(hf.in_proj_qkvz.weight.detach(), hf.in_proj_ba.weight.detach(), d)
    ours_q, ours_k, ours_v = (x @ qkv_w.T).split([d.key_dim, d.key_dim, d.value_dim], dim=-1)
    for name, hf_t, ours in (("q", q, ours_q), ("k", k, ours_k), ("v", v, ours_v), ("z", z, x @ z_w.T),
                             ("b", b, x @ b_w.T), ("a", a, x @ a_w.T)):
        assert torch.allclose(hf_t.reshape(ours.shape), ours, rtol=1e-6, atol=1e-6), f"{name} differs from HF's split"


@settings(max_examples=10)
@given(seed=SEEDS, tokens=st.integers(1, 70))
def test_layer_from_either_layout_state_dict_is_identical(seed, tokens):
    w, x, state = layer_case(seed, 1, tokens, F32)
    from_35 = GDNWeights.from_hf_state_dict(w.to_hf_state_dict("l.", layout="qwen3_5"), TINY_GDN, prefix="l.")
    from_next = GDNWeights.from_hf_state_dict(w.to_hf_state_dict("l.", layout="qwen3_next"), TINY_GDN, prefix="l.")
    y35, _ = gdn_layer(x, from_35, state)
    ynext, _ = gdn_layer(x, from_next, state)
    assert torch.equal(y35, ynext)


def test_missing_projection_weights_name_both_layouts():
    with pytest.raises(KeyError, match="in_proj_qkvz"):
        GDNWeights.from_hf_state_dict({}, TINY_GDN, prefix="model.layers.0.linear_attn.")
