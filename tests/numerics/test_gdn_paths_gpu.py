"""Every GDN rule path that runs on CUDA (the project's and fla-core's), at the real per-rank dims of Qwen3.6
under TP=4 (4 key heads, 8 value heads, head dim 128), against the float64 recurrent reference.

The GDN properties, on the GPU, for each path in GDN_RULE_PATHS (a newly registered path joins at once):
- equal to the reference at lengths around one and two chunk boundaries and at 1024, from a random state and
  from none, into NaN-poisoned outputs, leaving the initial state untouched;
- a prefill split in three with the state handed over equals the reference over the whole;
- decode steps handing their state along equal the reference and every prefill path over the same tokens;
- the state layout is [B, HV, K, V]: with K != V the final state must match the reference's, and at the real
  K == V a transposed initial state must give a different answer (so the check can tell the layouts apart).
Runs on torch >= 2.4 with CUDA; skipped without a CUDA device.
"""
from __future__ import annotations

import pytest
import torch

from model.gdn import GDN_RULE_PATHS, GDNDims, run_gdn_rule, state_dtype
from tests.numerics.compare import assert_close, poisoned_like, relative_error
from tests.numerics.gdn_attention_cases import generator, random_recurrent_state, rule_inputs
from model.tolerances import gdn_rule_tolerance

pytestmark = pytest.mark.gpu

F32, BF16 = torch.float32, torch.bfloat16
PER_RANK = GDNDims(hidden_size=2048, num_k_heads=4, num_v_heads=8, head_k_dim=128, head_v_dim=128, conv_kernel=4)
NARROW_V = GDNDims(hidden_size=2048, num_k_heads=4, num_v_heads=8, head_k_dim=128, head_v_dim=64, conv_kernel=4)
AROUND_CHUNKS = (1, 63, 64, 65, 127, 128, 129, 1024)
CUDA = torch.device("cuda")


def _cases(prefill_only: bool = False):
    for name, path in sorted(GDN_RULE_PATHS.items()):
        if path.is_reference or (prefill_only and path.max_tokens == 1):
            continue
        for dtype in (BF16, F32):
            why = path.unavailable_reason(CUDA, dtype) if torch.cuda.is_available() else "no CUDA device"
            marks = [pytest.mark.skip(reason=f"{name} {dtype}: {why}")] if why else []
            yield pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}", marks=marks)


def _on_gpu(batch, tokens, dims, dtype, seed, with_state=True):
    gen = generator(seed)
    q, k, v, g, beta = (t.to(CUDA) for t in rule_inputs(gen, batch, tokens, dims, dtype))
    state = random_recurrent_state(gen, batch, dims).to(CUDA) if with_state else None
    return q, k, v, g, beta, state


def reference(q, k, v, g, beta, state):
    return run_gdn_rule(GDN_RULE_PATHS.reference.name, q.double(), k.double(), v.double(), g.double(), beta.double(),
                        None if state is None else state.double())


def run_poisoned(name, q, k, v, g, beta, state):
    out = poisoned_like(v.shape, v.dtype, CUDA)
    final = poisoned_like((v.shape[0], v.shape[2], q.shape[3], v.shape[3]), state_dtype(name, v.dtype), CUDA)
    before = None if state is None else state.clone()
    run_gdn_rule(name, q, k, v, g, beta, state, out=out, final_state=final)
    if state is not None:
        assert torch.equal(state, before), f"{name} modified its initial_state"
    return out, final


@pytest.mark.parametrize(("name", "dtype"), list(_cases()))
def test_path_equals_reference_around_chunk_boundaries(name, dtype):
    path, bound = GDN_RULE_PATHS[name], gdn_rule_tolerance(name, dtype)
    for tokens in (t for t in AROUND_CHUNKS if path.supports(t, dtype, CUDA)):
        for batch in (1, 8, 64, 256) if tokens == 1 else (1,):  # decode batches; prefill at B=1
            for with_state in (True, False):
                q, k, v, g, beta, state = _on_gpu(batch, tokens, PER_RANK, dtype, seed=tokens + batch, with_state=with_state)
                ref_out, ref_state = reference(q, k, v, g, beta, state)
                out, final = run_poisoned(name, q, k, v, g, beta, state)
                what = f"{name} {dtype} B={batch} T={tokens} {'from a state' if with_state else 'from zeros'}"
                assert_close(out, ref_out, bound, f"{what}: output")
                assert_close(final, ref_state, bound, f"{what}: final state")


@pytest.mark.parametrize(("name", "dtype"), list(_cases(prefill_only=True)))
def test_split_prefill_with_state_handover_equals_reference(name, dtype):
    tokens, cuts = 200, (64, 137)
    q, k, v, g, beta, state = _on_gpu(1, tokens, PER_RANK, dtype, seed=7)
    ref_out, ref_state = reference(q, k, v, g, beta, state)
    outs, carried = [], state
    for lo, hi in zip((0, *cuts), (*cuts, tokens)):
        out, carried = run_poisoned(name, *(t[:, lo:hi] for t in (q, k, v, g, beta)), carried)
        outs.append(out)
    bound = gdn_rule_tolerance(name, dtype)
    assert_close(torch.cat(outs, 1), ref_out, bound, f"{name} {dtype} split at {cuts}: output")
    assert_close(carried, ref_state, bound, f"{name} {dtype} split at {cuts}: final state")


@pytest.mark.parametrize(("name", "dtype"), list(_cases()))
def test_decode_steps_equal_reference_and_every_prefill_path(name, dtype):
    steps, batch = 48, 8
    q, k, v, g, beta, state = _on_gpu(batch, steps, PER_RANK, dtype, seed=11)
    ref_out, ref_state = reference(q, k, v, g, beta, state)
    outs, carried = [], state
    for t in range(steps):
        out, carried = run_poisoned(name, *(x[:, t : t + 1] for x in (q, k, v, g, beta)), carried)
        outs.append(out)
    decoded = torch.cat(outs, 1)
    bound = gdn_rule_tolerance(name, dtype)
    assert_close(decoded, ref_out, bound, f"{steps} {name} steps {dtype}: output")
    assert_close(carried, ref_state, bound, f"{steps} {name} steps {dtype}: final state")
    for other, path in GDN_RULE_PATHS.items():
        if path.is_reference or not path.supports(steps, dtype, CUDA):
            continue
        prefill, prefill_state = run_poisoned(other, q, k, v, g, beta, state)
        both = bound + gdn_rule_tolerance(other, dtype)  # each is within its bound of the reference
        assert_close(decoded, prefill, both, f"{name} steps vs {other} prefill {dtype}: output")
        assert_close(carried, prefill_state, both, f"{name} steps vs {other} prefill {dtype}: state")


@pytest.mark.parametrize(("name", "dtype"), list(_cases()))
def test_state_layout_is_batch_heads_k_v(name, dtype):
    path, bound = GDN_RULE_PATHS[name], gdn_rule_tolerance(name, dtype)
    tokens = 1 if path.max_tokens == 1 else 65
    # K = 128, V = 64: a state read or written as [V, K] cannot pass.
    q, k, v, g, beta, state = _on_gpu(2, tokens, NARROW_V, dtype, seed=3)
    ref_out, ref_state = reference(q, k, v, g, beta, state)
    out, final = run_poisoned(name, q, k, v, g, beta, state)
    assert final.shape == (2, NARROW_V.num_v_heads, NARROW_V.head_k_dim, NARROW_V.head_v_dim)
    assert_close(out, ref_out, bound, f"{name} {dtype} K=128 V=64: output")
    assert_close(final, ref_state, bound, f"{name} {dtype} K=128 V=64: final state")
    # At the real K == V both layouts have one shape: the transposed state must be told apart.
    q, k, v, g, beta, state = _on_gpu(2, tokens, PER_RANK, dtype, seed=4)
    ref_out, _ = reference(q, k, v, g, beta, state)
    out, _ = run_poisoned(name, q, k, v, g, beta, state.transpose(-1, -2).contiguous())
    # The first token's output is mostly the initial state read out, so a swapped layout shows there.
    err = relative_error(out[:, :1], ref_out[:, :1])
    assert err > 10 * bound, f"{name}: a [V, K] state gave the [K, V] answer (error {err:.2e})"
