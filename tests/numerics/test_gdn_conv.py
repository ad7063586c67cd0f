"""Causal conv1d paths (model.gdn.CONV_PATHS): equal to the float64 window sum, and the carried conv state
makes a split prefill and per-token updates equal one pass."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from model.gdn import CONV_PATHS, run_conv_path
from tests.numerics.compare import assert_close, cpu_supports
from tests.numerics.gdn_attention_cases import generator, randn
from model.tolerances import GDN_CONV_PATHS, GDN_HANDOVER

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
DTYPES = [d for d in (F64, F32, BF16) if cpu_supports(d)]
SEEDS = st.integers(0, 2**32 - 1)
CHANNELS = 24


def conv_case(seed: int, batch: int, tokens: int, kernel: int, dtype: torch.dtype):
    gen = generator(seed)
    x = randn(gen, batch, tokens, CHANNELS, dtype=dtype)
    weight = randn(gen, CHANNELS, kernel, dtype=dtype, scale=0.5)
    state = randn(gen, batch, CHANNELS, kernel - 1, dtype=dtype)
    return x, weight, state


def test_every_conv_path_has_a_tolerance():
    assert not set(CONV_PATHS) - set(GDN_CONV_PATHS), "add the conv path's tolerance to tolerances.py"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CONV_PATHS))
@settings(max_examples=30)
@given(seed=SEEDS, tokens=st.integers(1, 70), batch=st.integers(1, 2), kernel=st.integers(2, 5))
def test_conv_path_equals_window_sum(name, dtype, seed, tokens, batch, kernel):
    tokens = min(tokens, CONV_PATHS[name].max_tokens or tokens)
    x, weight, state = conv_case(seed, batch, tokens, kernel, dtype)
    before = state.clone()
    ref_y, ref_state = run_conv_path(CONV_PATHS.reference.name, x.double(), weight.double(), state.double())
    y, new_state = run_conv_path(name, x, weight, state)
    assert torch.equal(state, before), f"conv path {name} modified the incoming state"
    assert_close(y, ref_y, GDN_CONV_PATHS[name][dtype], f"conv {name} {dtype} T={tokens} output")
    # The new state is a copy of inputs: exact, whatever the dtype.
    assert torch.equal(new_state, ref_state.to(new_state.dtype)), f"conv {name}: new state is not the last W-1 inputs"


@given(seed=SEEDS, tokens=st.integers(2, 40), kernel=st.integers(2, 5), data=st.data())
def test_conv_split_prefill_with_state_equals_one_pass(seed, tokens, kernel, data):
    """Includes splits shorter than the window: the state must then mix old state and new inputs."""
    split = data.draw(st.integers(1, tokens - 1), label="split")
    x, weight, state = conv_case(seed, 1, tokens, kernel, F32)
    whole, whole_state = run_conv_path("prefill", x, weight, state)
    first, mid = run_conv_path("prefill", x[:, :split], weight, state)
    second, end = run_conv_path("prefill", x[:, split:], weight, mid)
    assert_close(torch.cat([first, second], 1), whole, GDN_HANDOVER[F32], f"conv split {split}/{tokens}")
    assert torch.equal(end, whole_state)


@given(seed=SEEDS, tokens=st.integers(1, 20), kernel=st.integers(2, 5))
def test_conv_updates_equal_prefill(seed, tokens, kernel):
    x, weight, state = conv_case(seed, 2, tokens, kernel, F32)
    whole, whole_state = run_conv_path("prefill", x, weight, state)
    ys = []
    for t in range(tokens):
        y, state = run_conv_path("update", x[:, t : t + 1], weight, state)
        ys.append(y)
    assert_close(torch.cat(ys, 1), whole, GDN_HANDOVER[F32], f"{tokens} conv updates")
    assert torch.equal(state, whole_state)


def test_conv_names_the_state_layout_on_a_mismatch():
    x, weight, state = conv_case(0, 1, 3, 4, F32)
    with pytest.raises(ValueError, match=r"\[B, C, W-1\]"):
        run_conv_path("prefill", x, weight, state.transpose(1, 2))
