"""The fused MoE block path (`triton_fused_block`, model.moe.triton_block) on the CPU through Triton's interpreter.

Not collected by the suite itself (the file name does not start with `test_`): the interpreter must be chosen
before triton is imported, so test_moe_block_triton_interpreter.py runs this module in a subprocess with
TRITON_INTERPRET=1. Run it by hand the same way:

    TRITON_INTERPRET=1 python -m pytest tests/numerics/moe_block_interpreter_checks.py -p no:xdist

Dims are small and examples few (the interpreter runs each Triton program as Python), but they keep the real
block's structure: up to 8 of up to 16 experts, a shared intermediate size unlike the experts', exact ties.
The same property must fail on each deliberately wrong block at the end of the file.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import Phase, settings
from hypothesis import strategies as st

from model import tolerances
from model.dispatch.paths import LOW_PRECISION, ComputePath
from model.dispatch.table import SCHEMA, TABLE_ENV, clear_table_cache
from model.moe import MOE_BLOCK_PATHS, MoEConfig, moe_block, select_block_path, triton_decode, triton_router
from model.moe.block_paths import FUSED_BLOCK_MAX_TOKENS
from tests.numerics.compare import assert_close
from tests.numerics.moe_cases import (
    BLOCK_ROUTING_PATTERNS, MoECase, block_reference, check_block_path, make_block_weights, make_hidden, moe_cases,
)

FUSED = "triton_fused_block"
DTYPE_IDS = {d: str(d).removeprefix("torch.") for d in LOW_PRECISION}
EXAMPLES_PER_DTYPE = {torch.float32: 6, torch.bfloat16: 6, torch.float16: 3}
# For very negative logits the interpreter's numpy exp(-z) in sigmoid overflows to inf on purpose (sigmoid -> 0).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

CASES = moe_cases(
    tokens=st.integers(1, 20),
    experts=st.integers(1, 16),
    hidden=st.integers(4, 40),
    intermediate=st.integers(1, 24),
    shared_intermediate=st.integers(1, 24),
    patterns=st.sampled_from(BLOCK_ROUTING_PATTERNS),
)
# Always run. The interpreter's blocks (triton_decode.INTERPRETER_CONFIG) are 16 intermediate rows, 32 hidden
# columns a gate-up step, 64 hidden outputs a down program: past each, so every loop takes several steps and
# every grid axis several programs; the shared expert wider, then narrower, than the routed ones.
EDGE_CASES = (
    MoECase(tokens=1, experts=1, top_k=1, hidden=4, intermediate=1, shared_intermediate=1, pattern="random", seed=0),
    MoECase(tokens=20, experts=16, top_k=8, hidden=40, intermediate=20, shared_intermediate=12, pattern="ties", seed=1),
    MoECase(tokens=3, experts=12, top_k=5, hidden=70, intermediate=7, shared_intermediate=36, pattern="skewed", seed=2),
)


def _case(tokens=4, top_k=3, **kw) -> MoECase:
    fields = dict(experts=8, hidden=24, intermediate=12, shared_intermediate=20, pattern="random", seed=5)
    return MoECase(tokens=tokens, top_k=top_k, **{**fields, **kw})


def test_fused_block_runs_through_the_interpreter_on_cpu():
    path = MOE_BLOCK_PATHS[FUSED]
    assert triton_decode.INTERPRETED and triton_router.INTERPRETED, "TRITON_INTERPRET=1 was not in effect"
    assert all(path.supports(1, dtype, "cpu") for dtype in LOW_PRECISION)
    assert path.supports(FUSED_BLOCK_MAX_TOKENS, torch.float32, "cpu")
    assert not path.supports(FUSED_BLOCK_MAX_TOKENS + 1, torch.float32, "cpu")
    assert not path.supports(1, torch.float64, "cpu"), "the fused block has no float64 kernels"
    assert not path.supports(1, torch.float32, "cuda"), "interpreted kernels claim a GPU"


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=DTYPE_IDS.get)
def test_fused_block_equals_float64_block(dtype):
    check_block_path(
        MOE_BLOCK_PATHS[FUSED], dtype, tolerances.MOE_BLOCK_PATHS[FUSED][dtype], cases=CASES,
        run_settings=settings(max_examples=EXAMPLES_PER_DTYPE[dtype]), examples=EDGE_CASES,
    )


def test_fused_block_reads_strided_inputs_and_writes_every_element():
    """x's row stride is the kernels' own; weights whose last dim has a stride are copied by the wrapper."""
    case = _case(tokens=5)
    w = make_block_weights(case, torch.float32)
    x_wide = torch.cat([make_hidden(case, torch.float32), torch.full((5, 7), float("nan"))], dim=1)
    x = x_wide[:, : case.hidden]  # row stride 31: the NaN columns must never be read
    transposed = {name: t.transpose(-1, -2).contiguous().transpose(-1, -2) for name, t in w.tensors().items()}
    strided = type(w)(**transposed, top_k=w.top_k)
    out = MOE_BLOCK_PATHS[FUSED].fn(x, strided, MoEConfig(), "topk_softmax")
    ref, scale = block_reference(x, w)
    assert_close(out, ref, tolerances.MOE_BLOCK_PATHS[FUSED][torch.float32], "strided inputs", scale=scale)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, on inf - inf
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_fused_block_non_finite_hidden_state_propagates_to_its_token_only(bad):
    case = _case(tokens=4)
    w = make_block_weights(case, torch.float32)
    x = make_hidden(case, torch.float32)
    x[2, 1] = bad
    out = MOE_BLOCK_PATHS[FUSED].fn(x, w, MoEConfig(), "topk_softmax")
    assert not torch.isfinite(out[2]).any(), f"a {bad} hidden state was masked: {out[2]}"
    assert torch.isfinite(out[[0, 1, 3]]).all(), f"a {bad} in token 2 leaked into other tokens"


def test_fused_block_refuses_weights_in_another_dtype():
    case = _case()
    w = make_block_weights(case, torch.float32)
    with pytest.raises(ValueError, match="every weight in x's dtype torch.bfloat16.*'composed'"):
        MOE_BLOCK_PATHS[FUSED].fn(make_hidden(case, torch.bfloat16), w, MoEConfig(), "topk_softmax")


def test_moe_block_runs_the_fused_block_where_a_table_names_it(tmp_path, monkeypatch):
    """Here the fused block can run on the CPU, so a table's entry for it is followed up to its token limit."""
    table = tmp_path / "table.json"
    ranges = [{"from": 1, "to": None, "path": FUSED}]
    table.write_text(json.dumps({"schema": SCHEMA, "device": "cpu", "dtype": "float32", "recorded": {},
                                 "blocks": {"moe_block": {"keyed_by": "tokens", "ranges": ranges}}}))
    monkeypatch.setenv(TABLE_ENV, str(table))
    clear_table_cache()
    try:
        limit = FUSED_BLOCK_MAX_TOKENS
        assert [select_block_path(t, "cpu", torch.float32) for t in (1, limit, limit + 1)] == [FUSED, FUSED, "composed"]
        case = _case(tokens=3)
        w, x = make_block_weights(case, torch.float32), make_hidden(case, torch.float32)
        assert torch.equal(moe_block(x, w), MOE_BLOCK_PATHS[FUSED].fn(x, w, MoEConfig(), "topk_softmax"))
    finally:
        monkeypatch.delenv(TABLE_ENV)
        clear_table_cache()


# --- deliberately wrong fused blocks: the property above must report each -----------------------------------

# Each bug shows on the first examples; shrinking would rerun the interpreter dozens of times for nothing.
CATCH = settings(max_examples=8, derandomize=True, database=None, deadline=None,
                 phases=(Phase.explicit, Phase.generate))
SMALL_CASES = moe_cases(tokens=st.integers(1, 4), experts=st.integers(2, 8), hidden=st.integers(4, 24),
                        intermediate=st.integers(1, 12), shared_intermediate=st.integers(1, 12))


def fused(x, w):
    return MOE_BLOCK_PATHS[FUSED].fn(x, w, MoEConfig(), "topk_softmax")


def _shared_mlp_and_gate_logit(x, w):
    x64, w64 = x.double(), w.to(torch.float64)
    mlp = F.linear(F.silu(F.linear(x64, w64.shared_w1)) * F.linear(x64, w64.shared_w3), w64.shared_w2)
    return mlp, F.linear(x64, w64.shared_gate)


def fused_without_the_shared_slot(x, w, config, router):
    """The routed kernels alone: the shared expert never added."""
    weights, ids = triton_router.route_triton_fused(F.linear(x, w.router), w.top_k)
    return triton_decode.experts_triton_decode(x, w.w13, w.w2, weights, ids, torch.empty_like(x))


def fused_gate_without_sigmoid(x, w, config, router):
    """The shared expert weighted by its gate's logit instead of sigmoid(logit)."""
    mlp, logit = _shared_mlp_and_gate_logit(x, w)
    return (fused(x, w).double() + (logit - torch.sigmoid(logit)) * mlp).to(x.dtype)


def fused_slightly_off(x, w, config, router):
    """Wrong by 1e-5 relative: ten times the float32 bound, which must see it."""
    return fused(x, w) * (1 + 1e-5)


@pytest.mark.parametrize("wrong_fn", [fused_without_the_shared_slot, fused_gate_without_sigmoid, fused_slightly_off],
                         ids=["shared_slot_dropped", "gate_without_sigmoid", "off_by_1e-5"])
def test_a_wrong_fused_block_is_reported(wrong_fn):
    wrong = ComputePath(f"wrong_{wrong_fn.__name__}", wrong_fn, max_tokens=FUSED_BLOCK_MAX_TOKENS, dtypes=LOW_PRECISION)
    dtype = torch.float32
    with pytest.raises(AssertionError, match=f"{wrong.name} torch.float32: relative error"):
        check_block_path(wrong, dtype, tolerances.MOE_BLOCK_PATHS[FUSED][dtype], cases=SMALL_CASES,
                         run_settings=CATCH)
