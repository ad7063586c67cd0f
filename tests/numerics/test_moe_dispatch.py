"""The dispatcher runs the configured path on both sides of every threshold, and that path is right."""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from unittest.mock import patch

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from model.moe import EXPERT_PATHS, MoEConfig, dispatch_experts, select_expert_path
from model.moe.experts import experts_magnitude, experts_reference
from model import tolerances
from tests.numerics.compare import assert_close, poisoned_like
from tests.numerics.moe_cases import MoECase, make_hidden, make_moe_weights, make_routing

TINY_PATH = {"tokenwise": "tiny_tokenwise", "bmm": "tiny_bmm"}


def expected_path(tokens: int, config: MoEConfig) -> str:
    """The dispatch rule, restated from the docstring of model.moe.dispatch.select_expert_path."""
    if not config.native:
        return EXPERT_PATHS.reference.name
    if tokens == 1 and config.decode_native:
        return "decode_fused"
    if tokens <= config.tiny_max:
        return TINY_PATH[config.tiny_impl]
    return config.prefill_impl


@contextmanager
def recorded_calls():
    """Wrap every registered path so the test sees which one actually ran."""
    calls: list[str] = []
    spies = {}
    for name, path in EXPERT_PATHS.items():

        def spy(*args, _fn=path.fn, _name=name):
            calls.append(_name)
            return _fn(*args)

        spies[name] = dataclasses.replace(path, fn=spy)
    with patch.dict(EXPERT_PATHS, spies):
        yield calls


@given(
    tiny_max=st.integers(0, 12),
    tiny_impl=st.sampled_from(sorted(TINY_PATH)),
    prefill_impl=st.sampled_from(["sorted", "grouped_mm"]),
    decode_native=st.booleans(),
    native=st.booleans(),
    side=st.sampled_from([0, 1]),
    seed=st.integers(0, 2**31 - 1),
)
def test_dispatcher_runs_the_configured_path_at_and_past_tiny_max(
    tiny_max, tiny_impl, prefill_impl, decode_native, native, side, seed
):
    config = MoEConfig(native, decode_native, tiny_impl, tiny_max, prefill_impl)
    tokens = max(1, tiny_max + side)  # T = TINY_MAX and T = TINY_MAX + 1
    case = MoECase(tokens, experts=8, top_k=2, hidden=16, intermediate=8, shared_intermediate=8, pattern="random", seed=seed)
    x = make_hidden(case, torch.float32)
    w = make_moe_weights(case, torch.float32)
    weights, ids = make_routing(case)
    with recorded_calls() as calls:
        out = dispatch_experts(x, w.w13, w.w2, weights, ids, config)
    want = expected_path(tokens, config)
    assert select_expert_path(tokens, config) == want
    assert calls == [want], f"T={tokens} {config}: ran {calls}, expected {want}"
    ref = experts_reference(x, w.w13, w.w2, weights, ids, poisoned_like(x.shape, torch.float64, "cpu"))
    assert_close(out, ref, tolerances.expert_path_tolerance(want, torch.float32), f"dispatched {want}",
                 scale=experts_magnitude(x, w.w13, w.w2, weights, ids))


@pytest.mark.parametrize(
    ("tokens", "config", "path"),
    [
        (1, MoEConfig(), "decode_fused"),
        (4, MoEConfig(), "tiny_tokenwise"),  # the notes' default TINY_MAX=4 is inclusive
        (5, MoEConfig(), "sorted"),
        (1, MoEConfig(decode_native=False), "tiny_tokenwise"),
        (1, MoEConfig(decode_native=False, tiny_max=0), "sorted"),
        (8, MoEConfig(tiny_impl="bmm", tiny_max=8), "tiny_bmm"),
        (9, MoEConfig(tiny_impl="bmm", tiny_max=8, prefill_impl="grouped_mm"), "grouped_mm"),
        (1, MoEConfig(native=False), "reference"),
        (4096, MoEConfig(native=False), "reference"),
    ],
)
def test_dispatch_table(tokens, config, path):
    assert select_expert_path(tokens, config) == path


def test_dispatcher_rejects_an_empty_batch():
    with pytest.raises(ValueError, match="at least one token"):
        select_expert_path(0, MoEConfig())


def test_dispatcher_names_the_knob_when_the_configured_path_cannot_run():
    case = MoECase(6, experts=4, top_k=1, hidden=8, intermediate=4, shared_intermediate=4, pattern="random", seed=0)
    x = make_hidden(case, torch.float64)
    w = make_moe_weights(case, torch.float64)
    weights, ids = make_routing(case)
    with pytest.raises(ValueError, match="ENGINEX_MOE_PREFILL_IMPL"):
        dispatch_experts(x, w.w13, w.w2, weights, ids, MoEConfig(prefill_impl="grouped_mm"))
