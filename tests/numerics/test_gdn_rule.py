"""Gated delta rule paths (model.gdn.GDN_RULE_PATHS) against the float64 recurrent reference.

Every registered path runs on fresh random inputs drawn from a hypothesis seed, into NaN-poisoned output
and state buffers, and must equal the reference (outputs and final state) within the tolerance of its dtype.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from model.gdn import CHUNK_SIZE, GDN_RULE_PATHS, run_gdn_rule, state_dtype
from tests.numerics.compare import assert_close, cpu_supports, poisoned_like
from tests.numerics.gdn_attention_cases import TINY_GDN, generator, random_recurrent_state, rule_inputs
from model.tolerances import GDN_HANDOVER, GDN_RULE_PATHS as RULE_TOLERANCES, gdn_rule_tolerance

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
DTYPES = [d for d in (F64, F32, BF16) if cpu_supports(d)]
SEEDS = st.integers(0, 2**32 - 1)
AROUND_CHUNK = (CHUNK_SIZE - 1, CHUNK_SIZE, CHUNK_SIZE + 1, 2 * CHUNK_SIZE - 1, 2 * CHUNK_SIZE, 2 * CHUNK_SIZE + 1)


def reference(q, k, v, g, beta, state):
    return run_gdn_rule(
        GDN_RULE_PATHS.reference.name, q.double(), k.double(), v.double(), g.double(), beta.double(),
        None if state is None else state.double(),
    )


def run_poisoned(name, q, k, v, g, beta, state):
    """Run a path into NaN-filled buffers, checking it leaves `state` untouched."""
    out = poisoned_like(v.shape, GDN_RULE_PATHS[name].output_dtype(v.dtype), v.device)
    batch, _, heads, v_dim = v.shape
    final = poisoned_like((batch, heads, q.shape[3], v_dim), state_dtype(name, v.dtype), v.device)
    before = None if state is None else state.clone()
    result = run_gdn_rule(name, q, k, v, g, beta, state, out=out, final_state=final)
    if state is not None:
        assert torch.equal(state, before), f"{name} modified its initial_state in place"
    return result


def test_every_rule_path_has_a_tolerance():
    missing = sorted(set(GDN_RULE_PATHS) - set(RULE_TOLERANCES))
    assert not missing, f"rule paths without a tolerance in model/tolerances.py: {missing}"


def _cpu_cases():
    """(name, dtype) for every registered path; those that cannot run on a CPU (fla-core's need CUDA) are
    skipped with the path's own reason, and run gpu-marked in test_gdn_paths_gpu.py."""
    for name in sorted(GDN_RULE_PATHS):
        for dtype in DTYPES:
            why = GDN_RULE_PATHS[name].unavailable_reason("cpu", dtype)
            marks = [pytest.mark.skip(reason=f"{name} {dtype}: {why}")] if why else []
            yield pytest.param(name, dtype, id=f"{name}-{dtype}", marks=marks)


@pytest.mark.parametrize(("name", "dtype"), list(_cpu_cases()))
@settings(max_examples=40)
@given(seed=SEEDS, tokens=st.sampled_from(AROUND_CHUNK) | st.integers(1, 3 * CHUNK_SIZE), batch=st.integers(1, 2),
       with_state=st.booleans())
@example(seed=0, tokens=1, batch=1, with_state=True)
def test_rule_path_equals_recurrent_reference(name, dtype, seed, tokens, batch, with_state):
    path = GDN_RULE_PATHS[name]
    tokens = min(tokens, path.max_tokens or tokens)  # decode_step: one token
    gen = generator(seed)
    q, k, v, g, beta = rule_inputs(gen, batch, tokens, TINY_GDN, dtype)
    state = random_recurrent_state(gen, batch, TINY_GDN, state_dtype(name, dtype)) if with_state else None
    ref_out, ref_state = reference(q, k, v, g, beta, state)
    out, final = run_poisoned(name, q, k, v, g, beta, state)
    bound = gdn_rule_tolerance(name, dtype)
    assert_close(out, ref_out, bound, f"{name} {dtype} T={tokens} output")
    assert_close(final, ref_state, bound, f"{name} {dtype} T={tokens} final state")


@pytest.mark.parametrize("tokens", AROUND_CHUNK)
@settings(max_examples=8)
@given(seed=SEEDS)
def test_chunked_equals_recurrent_around_chunk_boundaries(tokens, seed):
    """Lengths one short of, at and one past one and two chunks: padding and the chunk scan hand-over."""
    gen = generator(seed)
    q, k, v, g, beta = rule_inputs(gen, 1, tokens, TINY_GDN, F32)
    state = random_recurrent_state(gen, 1, TINY_GDN)
    ref_out, ref_state = reference(q, k, v, g, beta, state)
    out, final = run_poisoned("chunked", q, k, v, g, beta, state)
    assert_close(out, ref_out, RULE_TOLERANCES["chunked"][F32], f"chunked T={tokens} output")
    assert_close(final, ref_state, RULE_TOLERANCES["chunked"][F32], f"chunked T={tokens} final state")


@pytest.mark.parametrize("dtype", [F64, F32], ids=str)
@given(seed=SEEDS, tokens=st.integers(2, 2 * CHUNK_SIZE + 3), data=st.data())
def test_chunked_split_with_state_handover_equals_one_pass(dtype, seed, tokens, data):
    split = data.draw(st.integers(1, tokens - 1), label="split")
    gen = generator(seed)
    q, k, v, g, beta = rule_inputs(gen, 1, tokens, TINY_GDN, dtype)
    state = random_recurrent_state(gen, 1, TINY_GDN, dtype if dtype == F64 else F32)
    whole, whole_state = run_gdn_rule("chunked", q, k, v, g, beta, state)
    first, mid_state = run_gdn_rule("chunked", *(t[:, :split] for t in (q, k, v, g, beta)), state)
    second, end_state = run_gdn_rule("chunked", *(t[:, split:] for t in (q, k, v, g, beta)), mid_state)
    assert_close(torch.cat([first, second], dim=1), whole, GDN_HANDOVER[dtype], f"split at {split}/{tokens} output")
    assert_close(end_state, whole_state, GDN_HANDOVER[dtype], f"split at {split}/{tokens} final state")


@settings(max_examples=30)
@given(seed=SEEDS, tokens=st.integers(1, 80))
def test_decode_steps_equal_chunked_prefill(seed, tokens):
    """T decode steps, each handing its float32 state to the next, equal one chunked prefill of T tokens."""
    gen = generator(seed)
    q, k, v, g, beta = rule_inputs(gen, 2, tokens, TINY_GDN, F32)
    state = random_recurrent_state(gen, 2, TINY_GDN)
    whole, whole_state = run_gdn_rule("chunked", q, k, v, g, beta, state)
    outs = []
    for t in range(tokens):
        o, state = run_gdn_rule("decode_step", *(x[:, t : t + 1] for x in (q, k, v, g, beta)), state)
        outs.append(o)
    assert_close(torch.cat(outs, dim=1), whole, GDN_HANDOVER[F32], f"{tokens} decode steps output")
    assert_close(state, whole_state, GDN_HANDOVER[F32], f"{tokens} decode steps final state")


def test_rule_rejects_a_state_in_the_wrong_layout():
    gen = generator(0)
    q, k, v, g, beta = rule_inputs(gen, 1, 3, TINY_GDN, F32)
    wrong = torch.ones(1, TINY_GDN.num_v_heads, TINY_GDN.head_v_dim + 1, TINY_GDN.head_k_dim)
    with pytest.raises(ValueError, match=r"\[B, HV, K, V\]"):
        run_gdn_rule("chunked", q, k, v, g, beta, wrong)


def test_decode_step_refuses_more_than_one_token():
    gen = generator(0)
    with pytest.raises(ValueError, match="does not support T=2"):
        run_gdn_rule("decode_step", *rule_inputs(gen, 1, 2, TINY_GDN, F32))


@settings(max_examples=15)
@given(seed=SEEDS, tokens=st.integers(CHUNK_SIZE // 2, 2 * CHUNK_SIZE))
def test_chunked_float32_stays_accurate_when_decay_varies_by_token(seed, tokens):
    """Data-dependent gating: per-token log decays spread log-uniformly over [-60, -0.01], so the log decay
    summed within a chunk reaches ~ -1000 while the last few slow tokens still carry the state. Decays taken
    as differences of one cumsum (HF's form) lose ~1e-5..1e-4 relative there in float32; the segment sums
    of `chunked` must keep the float32 bound."""
    gen = generator(seed)
    q, k, v, _, beta = rule_inputs(gen, 1, tokens, TINY_GDN, F32)
    log_rate = torch.rand(beta.shape, generator=gen, dtype=torch.float64) * (math.log(60) - math.log(0.01))
    g = -(log_rate + math.log(0.01)).exp().float()
    state = random_recurrent_state(gen, 1, TINY_GDN)
    ref_out, ref_state = reference(q, k, v, g, beta, state)
    out, final = run_poisoned("chunked", q, k, v, g, beta, state)
    bound = RULE_TOLERANCES["chunked"][F32]
    assert_close(out, ref_out, bound, f"chunked, varying decay, T={tokens}: output")
    assert_close(final, ref_state, bound, f"chunked, varying decay, T={tokens}: final state")
