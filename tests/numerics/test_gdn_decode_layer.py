"""GDN decode layer paths (model.gdn.GDN_DECODE_LAYER_PATHS): every path equals the float64 reference layer,
aliased (out_state is state: the in-place update) and not, and gdn_layer's one-token step goes through them.

The property lives here for every file that checks a path (`DecodeCase`, `decode_cases`,
`check_decode_layer_path`): H key heads with HV/H = 1, 2 and 4 value heads each, head dims that are not powers
of two, conv kernels 3 and 4, batches 1..5. A path that cannot run on this CPU is skipped here with where the
same property runs for it (`TESTED_ELSEWHERE`): `triton` under Triton's interpreter
(test_gdn_decode_triton_interpreter.py, which also shows the property rejecting broken kernels) and on a GPU
(test_gdn_decode_layer_gpu.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable
from unittest.mock import patch

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from model.gdn import GDN_DECODE_LAYER_PATHS, GDNDims, GDNState, gdn_layer, select_decode_layer_path
from model.tolerances import GDN_DECODE_LAYER, GDN_DECODE_LAYER_STATE
from tests.numerics.dispatch_fixture import one_block_table
from tests.numerics.compare import cpu_supports, poisoned_like, relative_error
from tests.numerics.gdn_attention_cases import TINY_GDN, generator, randn, random_gdn_state, random_gdn_weights
from tests.numerics.path_checks import path_params, run_property

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16
DTYPES = (F64, F32, BF16, F16)
DTYPE_BY_NAME = {str(d).removeprefix("torch."): d for d in DTYPES}
SEEDS = st.integers(0, 2**32 - 1)
REFERENCE = GDN_DECODE_LAYER_PATHS.reference
# Key heads x value heads per key head, the conv kernel, and head dims off the powers of two (masked lanes).
DECODE_DIMS = {
    "group1": GDNDims(hidden_size=32, num_k_heads=2, num_v_heads=2, head_k_dim=16, head_v_dim=8),
    "group2": TINY_GDN,
    "group4": GDNDims(hidden_size=32, num_k_heads=1, num_v_heads=4, head_k_dim=16, head_v_dim=16),
    "odd": GDNDims(hidden_size=24, num_k_heads=2, num_v_heads=4, head_k_dim=12, head_v_dim=10, conv_kernel=3),
}
# Paths that cannot run on a plain CPU, and where the same property runs for them instead.
TESTED_ELSEWHERE = {
    "triton": "tests/numerics/test_gdn_decode_triton_interpreter.py (Triton's interpreter) and "
              "test_gdn_decode_layer_gpu.py (CUDA)",
}


@dataclass(frozen=True)
class DecodeCase:
    dims: str  # a key of DECODE_DIMS: reads well in a shrunk counterexample
    batch: int
    dtype: str
    seed: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_BY_NAME[self.dtype]


def decode_cases(dtype: torch.dtype, dims=st.sampled_from(sorted(DECODE_DIMS)), batch=st.integers(1, 5)):
    return st.builds(DecodeCase, dims=dims, batch=batch, dtype=st.just(str(dtype).removeprefix("torch.")), seed=SEEDS)


def decode_inputs(case: DecodeCase, device="cpu", dims: GDNDims | None = None):
    """(x [B, 1, hidden], weights, state) for the case, on `device` (`dims` overrides the case's)."""
    dims = DECODE_DIMS[case.dims] if dims is None else dims
    gen, dtype = generator(case.seed), case.torch_dtype
    w = random_gdn_weights(gen, dims, dtype).to(device=device)
    x = randn(gen, case.batch, 1, dims.hidden_size, dtype=dtype).to(device)
    state = random_gdn_state(gen, case.batch, dims, dtype)
    return x, w, GDNState(state.conv.to(device), state.recurrent.to(device))


def reference_layer(x, w, state) -> tuple[torch.Tensor, GDNState]:
    """The float64 reference's output and its state after the token, in float64."""
    out = GDNState(torch.empty(state.conv.shape, dtype=F64, device=x.device),
                   torch.empty(state.recurrent.shape, dtype=F64, device=x.device))
    return REFERENCE.fn(x, w, state, out), out


def _poisoned_state(state: GDNState, conv_dtype: torch.dtype, recurrent_dtype: torch.dtype) -> GDNState:
    return GDNState(poisoned_like(state.conv.shape, conv_dtype, state.conv.device),
                    poisoned_like(state.recurrent.shape, recurrent_dtype, state.recurrent.device))


def decode_layer_errors(fn: Callable, case: DecodeCase, output_dtype, state_dtypes, device="cpu",
                        dims: GDNDims | None = None) -> tuple[float, float, float]:
    """fn's relative errors (output, conv state, recurrent state) against the float64 reference, after checking
    that it fills a NaN-poisoned out_state, leaves the input state alone, and gives the same bits in place."""
    x, w, state = decode_inputs(case, device, dims)
    before = GDNState(state.conv.clone(), state.recurrent.clone())
    ref, ref_state = reference_layer(x, w, state)

    out_state = _poisoned_state(state, *state_dtypes)
    y = fn(x, w, state, out_state)
    assert y.dtype == output_dtype and y.shape == x.shape, f"output {y.dtype} {tuple(y.shape)} for {case}"
    assert torch.equal(state.conv, before.conv) and torch.equal(state.recurrent, before.recurrent), \
        f"the path wrote into its input state for {case}"

    # In place (out_state is the state itself): the same bits as into a separate state of the same dtypes.
    if (out_state.conv.dtype, out_state.recurrent.dtype) == (state.conv.dtype, state.recurrent.dtype):
        y_separate, separate = y, out_state
    else:
        separate = state.empty_like()
        y_separate = fn(x, w, state, separate)
    shared = GDNState(before.conv.clone(), before.recurrent.clone())
    y_in_place = fn(x, w, shared, shared)
    assert torch.equal(y_in_place, y_separate), f"in place, the output differs for {case}"
    assert torch.equal(shared.conv, separate.conv) and torch.equal(shared.recurrent, separate.recurrent), \
        f"in place, the state after the token differs for {case}"
    return (relative_error(y, ref), relative_error(out_state.conv, ref_state.conv),
            relative_error(out_state.recurrent, ref_state.recurrent))


def path_state_dtypes(name: str, dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
    """(conv, recurrent) dtypes a caller allocates for the path: the activation dtype and the path's state dtype
    (the reference keeps both in float64)."""
    path = GDN_DECODE_LAYER_PATHS[name]
    return path.output_dtype(dtype), path.state_dtype(dtype)


def check_decode_layer_path(
    fn: Callable,
    dtype: torch.dtype,
    output_bound: float,
    state_bound: float,
    output_dtype: torch.dtype | None = None,
    state_dtypes: tuple[torch.dtype, torch.dtype] | None = None,
    device="cpu",
    cases=None,
    run_settings: settings | None = None,
    examples: tuple[DecodeCase, ...] = (),
    dims: GDNDims | None = None,
) -> None:
    """Property: for every drawn case `fn` (a decode layer path) is within `output_bound` (output) and
    `state_bound` (both state parts) of the float64 reference, aliased or not. Raises hypothesis's failure
    (the shrunk case in its report) when the path is wrong."""
    output_dtype = dtype if output_dtype is None else output_dtype
    state_dtypes = (dtype, torch.float64 if dtype == F64 else F32) if state_dtypes is None else state_dtypes

    @given(case=decode_cases(dtype) if cases is None else cases)
    def decode_layer_matches_reference(case: DecodeCase) -> None:
        out_err, conv_err, rec_err = decode_layer_errors(fn, case, output_dtype, state_dtypes, device, dims)
        note(f"{dtype}: relative errors output {out_err:.3e}, conv state {conv_err:.3e}, recurrent {rec_err:.3e}")
        assert out_err <= output_bound, f"output: relative error {out_err:.3e} > {output_bound:.1e} for {case}"
        assert conv_err <= state_bound, f"conv state: relative error {conv_err:.3e} > {state_bound:.1e} for {case}"
        assert rec_err <= state_bound, f"recurrent state: relative error {rec_err:.3e} > {state_bound:.1e} for {case}"

    run_property(decode_layer_matches_reference, examples, run_settings)


def edge_cases(dtype: torch.dtype) -> tuple[DecodeCase, ...]:
    """Always run: one sequence of each head structure."""
    name = str(dtype).removeprefix("torch.")
    return tuple(DecodeCase(dims, 1, name, i) for i, dims in enumerate(sorted(DECODE_DIMS)))


def test_every_decode_layer_path_has_tolerances_for_each_dtype_it_takes():
    missing = [(name, dtype) for name, path in GDN_DECODE_LAYER_PATHS.items() for dtype in DTYPES
               if dtype in path.dtypes and (dtype not in GDN_DECODE_LAYER.get(name, {})
                                            or dtype not in GDN_DECODE_LAYER_STATE.get(name, {}))]
    assert not missing, f"add tolerances for {missing} to model/tolerances.py (GDN_DECODE_LAYER, GDN_DECODE_LAYER_STATE)"


def test_every_path_this_cpu_cannot_run_names_where_it_is_tested():
    untested = [name for name, path in GDN_DECODE_LAYER_PATHS.items()
                if any(path.unavailable_reason("cpu", d) for d in path.dtypes) and name not in TESTED_ELSEWHERE]
    assert not untested, f"decode layer paths {untested} cannot run on this CPU: test them elsewhere, add to TESTED_ELSEWHERE"


def test_every_path_takes_one_token_only():
    assert all(p.takes_tokens(1) and not p.takes_tokens(2) for p in GDN_DECODE_LAYER_PATHS.values())


def _no_f16(dtype) -> str | None:
    return "this CPU build has no float16 GEMM" if dtype == F16 and not cpu_supports(F16) else None


@pytest.mark.parametrize(("name", "dtype"), list(path_params(GDN_DECODE_LAYER_PATHS, DTYPES, TESTED_ELSEWHERE,
                                                               _no_f16)))
def test_decode_layer_path_equals_float64_reference(name, dtype):
    path = GDN_DECODE_LAYER_PATHS[name]
    check_decode_layer_path(
        path.fn, dtype, GDN_DECODE_LAYER[name][dtype], GDN_DECODE_LAYER_STATE[name][dtype],
        output_dtype=path.output_dtype(dtype), state_dtypes=path_state_dtypes(name, dtype),
        examples=edge_cases(dtype),
    )


# --- gdn_layer's one-token step --------------------------------------------------------------------------

@settings(max_examples=15)
@given(case=decode_cases(F32) | decode_cases(BF16) | decode_cases(F64))
def test_gdn_layer_default_step_is_the_staged_path_bit_for_bit(case):
    """With no table (every CPU), gdn_layer's one-token step is `staged`, which is the per-block computation
    gdn_layer ran before the table (forcing conv='update' still runs that computation directly)."""
    x, w, state = decode_inputs(case)
    before = GDNState(state.conv.clone(), state.recurrent.clone())
    y, new_state = gdn_layer(x, w, state)
    out_state = state.empty_like()
    y_staged = GDN_DECODE_LAYER_PATHS["staged"].fn(x, w, state, out_state)
    y_blocks, blocks_state = gdn_layer(x, w, state, conv="update")
    for a, b in ((y, y_staged), (y, y_blocks), (new_state.conv, out_state.conv), (new_state.conv, blocks_state.conv),
                 (new_state.recurrent, out_state.recurrent), (new_state.recurrent, blocks_state.recurrent)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"not bit-equal for {case}"
    assert torch.equal(state.conv, before.conv) and torch.equal(state.recurrent, before.recurrent)
    assert new_state.conv is not state.conv and new_state.recurrent is not state.recurrent


@pytest.mark.parametrize("tokens", [1, 3])
def test_gdn_layer_in_place_overwrites_and_returns_the_input_state(tokens):
    gen = generator(tokens)
    w = random_gdn_weights(gen, TINY_GDN, F32)
    x = randn(gen, 2, tokens, TINY_GDN.hidden_size)
    state = random_gdn_state(gen, 2, TINY_GDN, F32)
    y, expected = gdn_layer(x, w, state)
    y_in_place, returned = gdn_layer(x, w, state, in_place=True)
    assert returned.conv is state.conv and returned.recurrent is state.recurrent
    assert torch.equal(y_in_place, y)
    assert torch.equal(state.conv, expected.conv) and torch.equal(state.recurrent, expected.recurrent)


def _spy_on_decode_paths():
    calls: list[str] = []
    spies = {n: dataclasses.replace(p, fn=lambda *a, _f=p.fn, _n=n: (calls.append(_n), _f(*a))[1])
             for n, p in GDN_DECODE_LAYER_PATHS.items()}
    return calls, patch.dict(GDN_DECODE_LAYER_PATHS, spies)


def test_gdn_layer_takes_the_decode_table_for_one_token_unless_a_block_path_is_forced():
    gen = generator(0)
    w = random_gdn_weights(gen, TINY_GDN, F32)
    one, three = randn(gen, 1, 1, TINY_GDN.hidden_size), randn(gen, 1, 3, TINY_GDN.hidden_size)
    calls, spying = _spy_on_decode_paths()
    with spying:
        gdn_layer(one, w)
        y_ref, _ = gdn_layer(one, w, decode_layer="reference")
        gdn_layer(three, w)
        gdn_layer(one, w, rule="decode_step")
        gdn_layer(one, w, conv="update")
        gdn_layer(one, w, norm="reference")
        gdn_layer(one, w, norm="fused")  # the staged layer's default norm, forced: still the staged blocks
    assert calls == ["staged", "reference"], calls
    assert y_ref.dtype == F64
    with pytest.raises(ValueError, match="decode_layer='staged' replaces the whole layer for one token"):
        gdn_layer(three, w, decode_layer="staged")
    with pytest.raises(ValueError, match="does not support"):
        gdn_layer(one.double(), w.to(F64), decode_layer="triton")


def test_decode_layer_refuses_shapes_it_cannot_take():
    from model.gdn import run_decode_layer

    gen = generator(1)
    w = random_gdn_weights(gen, TINY_GDN, F32)
    state = GDNState.zeros(2, TINY_GDN, F32)
    with pytest.raises(ValueError, match="takes one token"):
        run_decode_layer("staged", randn(gen, 2, 2, TINY_GDN.hidden_size), w, state, state)
    with pytest.raises(ValueError, match="out_state has conv"):
        run_decode_layer("staged", randn(gen, 2, 1, TINY_GDN.hidden_size), w, state, GDNState.zeros(1, TINY_GDN, F32))


def test_stacked_input_projection_is_a_view_when_loaded_and_a_cached_copy_otherwise():
    w = random_gdn_weights(generator(2), TINY_GDN, F32)  # four separate tensors
    expected = torch.cat([w.in_proj_qkv, w.in_proj_z, w.in_proj_b, w.in_proj_a])
    assert torch.equal(w.in_proj_stacked, expected) and w.in_proj_stacked is w.in_proj_stacked  # cached
    loaded = type(w).from_hf_state_dict(w.to_hf_state_dict(), TINY_GDN)
    stacked = loaded.in_proj_stacked
    assert torch.equal(stacked, expected)
    assert stacked.untyped_storage().data_ptr() == loaded.in_proj_qkv.untyped_storage().data_ptr(), "not a view"
    moved = loaded.to(F64)
    assert moved.in_proj_stacked.untyped_storage().data_ptr() == moved.in_proj_a.untyped_storage().data_ptr()


# --- the dispatch table's choice -------------------------------------------------------------------------

@pytest.fixture
def decode_table(tmp_path, monkeypatch):
    """QWEN36_DISPATCH_TABLE pointing at a table with a `gdn_layer_decode` block written from `ranges`."""
    with one_block_table(tmp_path, monkeypatch, "gdn_layer_decode") as write:
        yield write


def test_decode_layer_choice_is_staged_without_a_table(decode_table):
    assert select_decode_layer_path(1, "cpu", F32) == "staged"
    assert select_decode_layer_path(256, "cpu", BF16) == "staged"


def test_decode_layer_choice_follows_the_table_where_it_names_a_path_that_runs(decode_table):
    decode_table([(1, 2, "reference"), (3, 8, "triton"), (9, None, "no_such_path")])
    assert select_decode_layer_path(1, "cpu", F32) == "reference"
    assert select_decode_layer_path(2, "cpu", F32) == "reference"
    triton_runs = GDN_DECODE_LAYER_PATHS.can_run("triton", 1, F32, "cpu")
    assert select_decode_layer_path(5, "cpu", F32) == ("triton" if triton_runs else "staged")
    assert select_decode_layer_path(9, "cpu", F32) == "staged", "a name the table cannot run falls back"
    assert select_decode_layer_path(1, "cpu", BF16) == "staged", "the table was measured in float32"
    calls, spying = _spy_on_decode_paths()
    gen = generator(3)
    with spying:
        gdn_layer(randn(gen, 2, 1, TINY_GDN.hidden_size), random_gdn_weights(gen, TINY_GDN, F32))
    assert calls == ["reference"], "gdn_layer's one-token step runs the table's path"


def check_indexed_rows_equal_a_batch(case: DecodeCase, device="cpu", dims: GDNDims | None = None) -> None:
    """The fused kernel's `rows` mode (a server's state slots, advanced in place) against its plain batch mode on
    the same sequences: the same output and the same new state bit for bit (the same arithmetic, other addresses),
    and every slot no row names untouched. Run compiled by the GPU file and interpreted by
    gdn_decode_interpreter_checks.py."""
    from model.gdn import triton_decode_layer

    x, w, state = decode_inputs(case, device, dims)
    batch = case.batch
    proj = torch.nn.functional.linear(x.reshape(batch, -1), w.in_proj_stacked)
    plain_state = state.empty_like()
    plain = triton_decode_layer.fused_decode_core(proj, w, state, plain_state)

    slots = batch + 3
    rows = torch.randperm(slots, generator=torch.Generator().manual_seed(case.seed))[:batch].to(torch.int32)
    conv = torch.randn((slots, *state.conv.shape[1:]), generator=torch.Generator().manual_seed(1)).to(state.conv)
    recurrent = torch.randn((slots, *state.recurrent.shape[1:]),
                            generator=torch.Generator().manual_seed(2)).to(state.recurrent)
    long_rows = rows.to(device=device, dtype=torch.long)
    conv[long_rows], recurrent[long_rows] = state.conv, state.recurrent
    before = GDNState(conv.clone(), recurrent.clone())
    cache = GDNState(conv, recurrent)
    indexed = triton_decode_layer.fused_decode_core(proj, w, cache, cache, rows.to(device))

    assert torch.equal(indexed, plain)
    assert torch.equal(conv[long_rows], plain_state.conv) and torch.equal(recurrent[long_rows], plain_state.recurrent)
    others = torch.tensor([r for r in range(slots) if r not in rows.tolist()], dtype=torch.long, device=device)
    assert torch.equal(conv[others], before.conv[others]) and torch.equal(recurrent[others], before.recurrent[others])
