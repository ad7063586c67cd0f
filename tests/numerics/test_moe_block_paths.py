"""The MoE block's path table (model.moe.MOE_BLOCK_PATHS) and `moe_block`'s choice between its paths.

Every path that runs on this CPU equals the float64 block; `moe_block` with no dispatch table is `composed`, the
block as it was before the table existed, bit for bit; a table file's "moe_block" entry is followed where its
path can run the input, and ignored otherwise. The Triton path runs here only through the interpreter
(test_moe_block_triton_interpreter.py) and compiled on a GPU (test_moe_block_gpu.py).
"""
from __future__ import annotations

import importlib.util
import json
from unittest.mock import patch

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from model import tolerances
from model.dispatch.paths import ComputePath
from model.dispatch.table import DIR_ENV, SCHEMA, TABLE_ENV, clear_table_cache
from model.moe import (
    MOE_BLOCK_PATHS, ROUTERS, MoEConfig, dispatch_experts, moe_block, select_block_path, shared_expert,
)
from tests.numerics.compare import cpu_supports
from tests.numerics.moe_cases import (
    BLOCK_ROUTING_PATTERNS, MOE_CONFIGS, MoECase, check_block_path, make_block_weights, make_hidden, moe_cases,
)

# Why the Triton path does not run on this CPU: where Triton is installed (vLLM's CPU build brings it), it runs only
# through its interpreter; without vLLM's CPU build, Triton is not there at all.
WHY_NOT_ON_CPU = "TRITON_INTERPRET=1" if importlib.util.find_spec("triton") else "Triton is not installed"

DTYPES = [torch.float64, torch.float32, torch.bfloat16] + ([torch.float16] if cpu_supports(torch.float16) else [])
FUSED = "triton_fused_block"

# Kept on purpose: the smallest block; shared intermediate size above and below the experts'; exact ties.
EDGE_CASES = (
    MoECase(tokens=1, experts=1, top_k=1, hidden=4, intermediate=1, shared_intermediate=1, pattern="random", seed=0),
    MoECase(tokens=5, experts=16, top_k=8, hidden=24, intermediate=8, shared_intermediate=20, pattern="ties", seed=1),
    MoECase(tokens=9, experts=12, top_k=3, hidden=33, intermediate=16, shared_intermediate=5, pattern="skewed", seed=2),
)
BLOCK_CASES = moe_cases(tokens=st.integers(1, 80), experts=st.integers(1, 32), shared_intermediate=st.integers(1, 48),
                        patterns=st.sampled_from(BLOCK_ROUTING_PATTERNS))


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


CPU_PATH_DTYPES = [
    pytest.param(p.name, dtype, id=f"{p.name}-{_dtype_id(dtype)}")
    for p in MOE_BLOCK_PATHS.candidates()
    for dtype in DTYPES
    if p.supports(1, dtype, "cpu")
]


def test_every_block_path_has_a_tolerance_for_each_dtype_it_takes():
    missing = [(p.name, d) for p in MOE_BLOCK_PATHS.candidates() for d in p.dtypes
               if d not in tolerances.MOE_BLOCK_PATHS.get(p.name, {})]
    assert not missing, f"add tolerances for {missing} to model/tolerances.py"


def test_the_paths_this_cpu_cannot_run_are_the_triton_one_and_say_where_it_runs():
    """Otherwise the property below would leave a path out without a word."""
    if MOE_BLOCK_PATHS[FUSED].unavailable_reason("cpu", torch.float32) is None:
        pytest.skip("Triton's interpreter is in effect: the fused block runs on the CPU (and is tested below)")
    assert {name for name, _ in (p.values for p in CPU_PATH_DTYPES)} == {"composed"}
    why = MOE_BLOCK_PATHS[FUSED].unavailable_reason("cpu", torch.float32)
    assert why is not None and WHY_NOT_ON_CPU in why
    assert MOE_BLOCK_PATHS[FUSED].unavailable_reason("cpu", torch.float64).startswith("torch.float64 is not one of")
    assert not MOE_BLOCK_PATHS[FUSED].takes_tokens(65), "the fused block is for decode sizes"


@pytest.mark.parametrize(("name", "dtype"), CPU_PATH_DTYPES)
def test_block_path_equals_float64_block(name, dtype):
    check_block_path(MOE_BLOCK_PATHS[name], dtype, tolerances.MOE_BLOCK_PATHS[name][dtype], cases=BLOCK_CASES,
                     examples=EDGE_CASES)


def _block_before_the_table(x, w, config, router):
    """moe_block as it was written before the block had paths: the `composed` path must stay exactly this."""
    route = ROUTERS[router]
    weights, ids = route(F.linear(x, w.router), w.top_k)
    return dispatch_experts(x, w.w13, w.w2, weights, ids, config) + shared_expert(x, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_dtype_id)
@given(case=BLOCK_CASES, config=MOE_CONFIGS, router=st.sampled_from(["reference", "topk_softmax"]))
def test_moe_block_without_a_table_is_composed_bit_for_bit(dtype, case, config, router):
    w = make_block_weights(case, dtype)
    x = make_hidden(case, dtype)
    before = _block_before_the_table(x, w, config, router)
    assert torch.equal(moe_block(x, w, config, router), before)
    assert torch.equal(moe_block(x, w, config, router, block="composed"), before)


# --- choosing the path: the device's dispatch table, else `composed` ---------------------------------------


@pytest.fixture
def no_table_settings(monkeypatch):
    monkeypatch.delenv(TABLE_ENV, raising=False)
    monkeypatch.delenv(DIR_ENV, raising=False)
    clear_table_cache()
    yield
    clear_table_cache()


@pytest.fixture
def use_table(tmp_path, monkeypatch, no_table_settings):
    """Point QWEN36_DISPATCH_TABLE at a float32 table whose "moe_block" block has these (from, to, path) ranges."""

    def write(*spans):
        path = tmp_path / "table.json"
        ranges = [{"from": lo, "to": hi, "path": p} for lo, hi, p in spans]
        path.write_text(json.dumps({"schema": SCHEMA, "device": "cpu", "dtype": "float32", "recorded": {},
                                    "blocks": {"moe_block": {"keyed_by": "tokens", "ranges": ranges}}}))
        monkeypatch.setenv(TABLE_ENV, str(path))
        clear_table_cache()

    return write


@pytest.fixture
def spy_path():
    """A registered block path that records the token counts it was called with and runs `composed`."""
    calls: list[int] = []

    def spy(x, w, config, router):
        calls.append(x.shape[0])
        return MOE_BLOCK_PATHS["composed"].fn(x, w, config, router)

    with patch.dict(MOE_BLOCK_PATHS, {"spy": ComputePath("spy", spy, max_tokens=4)}):
        yield calls


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_without_a_table_every_token_count_gets_composed(dtype, no_table_settings):
    assert [select_block_path(t, "cpu", dtype) for t in (1, 8, 64, 65, 4096)] == ["composed"] * 5


def test_a_table_entry_is_followed_where_its_path_can_run_the_input(use_table, spy_path):
    use_table((1, 2, "spy"), (3, 6, FUSED), (7, 9, "no_such_path"), (10, None, "composed"))
    f32 = torch.float32
    assert [select_block_path(t, "cpu", f32) for t in (1, 2)] == ["spy", "spy"]
    # triton_fused_block cannot run on this CPU, a path the table names may not exist: `composed` serves.
    assert [select_block_path(t, "cpu", f32) for t in (3, 6, 7, 9, 10, 500)] == ["composed"] * 6
    assert select_block_path(1, "cpu", torch.bfloat16) == "composed", "the table was measured in float32"
    assert select_block_path(1, "cpu", f32, MoEConfig(native=False)) == "composed", "MOE_NATIVE=0 keeps composed"

    case = MoECase(tokens=2, experts=8, top_k=2, hidden=16, intermediate=8, shared_intermediate=8, pattern="random",
                   seed=3)
    w, x = make_block_weights(case, f32), make_hidden(case, f32)
    out = moe_block(x, w)
    assert spy_path == [2], "moe_block did not run the path the table names"
    assert torch.equal(out, moe_block(x, w, block="composed"))


def test_a_table_path_that_cannot_take_the_token_count_falls_back(use_table, spy_path):
    use_table((1, None, "spy"))  # the spy takes at most 4 tokens
    assert [select_block_path(t, "cpu", torch.float32) for t in (4, 5)] == ["spy", "composed"]


def test_a_named_block_path_is_checked_and_the_error_says_why(no_table_settings):
    case = MoECase(tokens=3, experts=4, top_k=2, hidden=8, intermediate=4, shared_intermediate=4, pattern="random",
                   seed=4)
    w, x = make_block_weights(case, torch.float32), make_hidden(case, torch.float32)
    with pytest.raises(ValueError, match=f"'{FUSED}' does not support T=3 torch.float32 on cpu.*{WHY_NOT_ON_CPU}"):
        moe_block(x, w, block=FUSED)
    with pytest.raises(KeyError, match="unknown MoE block path 'no_such'.*'composed'"):
        moe_block(x, w, block="no_such")
    assert moe_block(x, w, block="reference").dtype == torch.float64
    with pytest.raises(ValueError, match="at least one token"):
        select_block_path(0, "cpu", torch.float32)
