"""Attention decode layer paths (model.attention.decode_layer.ATTENTION_DECODE_LAYER_PATHS): every path equals the
float64 reference layer, writes the new key and value at position cache.length and nothing else, and gives the same bits
twice; `staged` is gated_attention_static bit for bit.

The property lives here for every file that checks a path (`AttentionDecodeCase`, `decode_cases`,
`check_attention_decode_path`): GQA groups 1, 2 and 4, head dims 16 and 32, rotary dims a quarter, half and all of
the head, cached lengths 0..MAX_LEN-1 (spanning several of the kernel's key blocks), batches 1..3. The cache's
positions at and past the length hold random finite values (stale keys): a path that reads them, or attends to
the new token from memory, gets another answer. A path that cannot run on this CPU is skipped here with where the
same property runs for it (`TESTED_ELSEWHERE`): `triton` under Triton's interpreter
(test_attention_decode_triton_interpreter.py, which also shows the property rejecting broken kernels) and on a GPU
(test_attention_decode_layer_gpu.py).
"""
from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Callable
from unittest.mock import patch

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from model.attention.decode_layer import (
    ATTENTION_DECODE_LAYER_PATHS, attention_static, run_attention_decode_layer, select_attention_decode_layer_path,
    served_attention_decode_layer,
)
from model.attention.layer import AttentionDims, AttentionWeights, StaticKVCache, gated_attention_static
from model.attention.rope import rope_cos_sin
from model.dispatch.table import BLOCKS
from model.tolerances import ATTENTION_CORES, ATTENTION_DECODE_LAYER, ATTENTION_DECODE_LAYER_CACHE
from tests.numerics.compare import cpu_supports, relative_error
from tests.numerics.dispatch_fixture import one_block_table
from tests.numerics.gdn_attention_cases import generator, randn, random_attention_weights
from tests.numerics.path_checks import path_params, run_property

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16
DTYPES = (F64, F32, BF16, F16)
DTYPE_BY_NAME = {str(d).removeprefix("torch."): d for d in DTYPES}
SEEDS = st.integers(0, 2**32 - 1)
REFERENCE = ATTENTION_DECODE_LAYER_PATHS.reference
HIDDEN = 32
# GQA group -> (query heads, kv heads).
GROUPS = {1: (2, 2), 2: (4, 2), 4: (4, 1)}
ROTARY = {"quarter": 4, "half": 2, "all": 1}  # rotary_dim = head_dim // this
# Buffer positions: past two of the kernel's 64-key blocks at these head dims (attention_triton_decode._tile).
MAX_LEN = 136
# Paths that cannot run on a plain CPU, and where the same property runs for them instead.
TESTED_ELSEWHERE = {
    "triton": "tests/numerics/test_attention_decode_triton_interpreter.py (Triton's interpreter) and "
              "test_attention_decode_layer_gpu.py (CUDA)",
}


@dataclass(frozen=True)
class AttentionDecodeCase:
    group: int  # query heads per kv head, a key of GROUPS
    head_dim: int
    rotary: str  # a key of ROTARY
    batch: int
    length: int  # tokens already cached: the new token's position
    dtype: str
    seed: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_BY_NAME[self.dtype]

    @property
    def dims(self) -> AttentionDims:
        heads, kv_heads = GROUPS[self.group]
        return AttentionDims(hidden_size=HIDDEN, num_heads=heads, num_kv_heads=kv_heads, head_dim=self.head_dim,
                             rotary_dim=self.head_dim // ROTARY[self.rotary], rope_theta=1e4)


def decode_cases(dtype: torch.dtype, group=st.sampled_from(sorted(GROUPS)), head_dim=st.sampled_from([16, 32]),
                 rotary=st.sampled_from(sorted(ROTARY)), batch=st.integers(1, 3),
                 length=st.integers(0, MAX_LEN - 1)):
    return st.builds(AttentionDecodeCase, group=group, head_dim=head_dim, rotary=rotary, batch=batch, length=length,
                     dtype=st.just(str(dtype).removeprefix("torch.")), seed=SEEDS)


def decode_inputs(case: AttentionDecodeCase, device="cpu", dims: AttentionDims | None = None,
                  max_len: int = MAX_LEN) -> tuple[torch.Tensor, AttentionWeights, StaticKVCache]:
    """(x [B, 1, hidden], weights, cache) for the case on `device` (`dims` overrides the case's). Every cache
    position holds a random finite value, the ones at and past the length too (stale keys)."""
    dims = case.dims if dims is None else dims
    gen, dtype = generator(case.seed), case.torch_dtype
    w = random_attention_weights(gen, dims, dtype).to(device=device)
    x = randn(gen, case.batch, 1, dims.hidden_size, dtype=dtype).to(device)
    shape = (case.batch, dims.num_kv_heads, max_len, dims.head_dim)
    k, v = (randn(gen, *shape, dtype=dtype).to(device) for _ in range(2))
    return x, w, StaticKVCache(k, v, torch.tensor(case.length, device=device))


def copy_cache(cache: StaticKVCache) -> StaticKVCache:
    return StaticKVCache(cache.k.clone(), cache.v.clone(), cache.length.clone())


def reference_layer(x, w, cache: StaticKVCache) -> tuple[torch.Tensor, StaticKVCache]:
    """The float64 reference's output, and a copy of `cache` with the new key and value it writes."""
    written = copy_cache(cache)
    return REFERENCE.fn(x, w, written), written


_SAME_SIZE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality (NaNs included, which torch.equal calls unequal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    as_int = _SAME_SIZE_INT[a.element_size()]
    return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


def _all_but(t: torch.Tensor, position: int) -> torch.Tensor:
    return torch.cat([t[:, :, :position], t[:, :, position + 1:]], dim=2)


def attention_decode_errors(fn: Callable, case: AttentionDecodeCase, output_dtype: torch.dtype, device="cpu",
                            dims: AttentionDims | None = None, max_len: int = MAX_LEN) -> tuple[float, float, float]:
    """fn's relative errors (output, new key, new value) against the float64 reference, after checking that it
    returns [B, 1, hidden] in `output_dtype`, leaves every other cache position and the length alone, and gives
    the same bits (output and cache) when run again on the same input."""
    x, w, cache = decode_inputs(case, device, dims, max_len)
    ref, ref_cache = reference_layer(x, w, cache)
    at = case.length

    ran = copy_cache(cache)
    y = fn(x, w, ran)
    assert y.dtype == output_dtype and y.shape == x.shape, f"output {y.dtype} {tuple(y.shape)} for {case}"
    assert torch.equal(ran.length, cache.length), f"the path moved the length for {case}"
    for what, after, before in (("k", ran.k, cache.k), ("v", ran.v, cache.v)):
        assert same_bits(_all_but(after, at), _all_but(before, at)), \
            f"the path wrote cache.{what} away from position {at} for {case}"

    again = copy_cache(cache)
    y_again = fn(x, w, again)
    assert same_bits(y_again, y), f"a second run gives other output bits for {case}"
    assert same_bits(again.k, ran.k) and same_bits(again.v, ran.v), f"a second run writes other bits for {case}"
    return (relative_error(y, ref), relative_error(ran.k[:, :, at], ref_cache.k[:, :, at]),
            relative_error(ran.v[:, :, at], ref_cache.v[:, :, at]))


def check_attention_decode_path(
    fn: Callable,
    dtype: torch.dtype,
    output_bound: float,
    cache_bound: float,
    output_dtype: torch.dtype | None = None,
    device="cpu",
    cases=None,
    run_settings: settings | None = None,
    examples: tuple[AttentionDecodeCase, ...] = (),
    dims: AttentionDims | None = None,
    max_len: int = MAX_LEN,
) -> None:
    """Property: for every drawn case `fn` (an attention decode layer path) is within `output_bound` (output) and
    `cache_bound` (the new key and value it writes) of the float64 reference, writes nothing else and repeats its
    bits. Raises hypothesis's failure (the shrunk case in its report) when the path is wrong."""
    output_dtype = dtype if output_dtype is None else output_dtype

    @given(case=decode_cases(dtype) if cases is None else cases)
    def attention_decode_matches_reference(case: AttentionDecodeCase) -> None:
        out_err, k_err, v_err = attention_decode_errors(fn, case, output_dtype, device, dims, max_len)
        note(f"{dtype}: relative errors output {out_err:.3e}, new key {k_err:.3e}, new value {v_err:.3e}")
        assert out_err <= output_bound, f"output: relative error {out_err:.3e} > {output_bound:.1e} for {case}"
        assert k_err <= cache_bound, f"new key: relative error {k_err:.3e} > {cache_bound:.1e} for {case}"
        assert v_err <= cache_bound, f"new value: relative error {v_err:.3e} > {cache_bound:.1e} for {case}"

    run_property(attention_decode_matches_reference, examples, run_settings)


def edge_cases(dtype: torch.dtype) -> tuple[AttentionDecodeCase, ...]:
    """Always run: each GQA group; an empty cache, a length on a key-block boundary (64), the last position."""
    name = str(dtype).removeprefix("torch.")
    return (AttentionDecodeCase(1, 16, "quarter", 1, 0, name, 0),
            AttentionDecodeCase(2, 32, "half", 2, 64, name, 1),
            AttentionDecodeCase(4, 16, "all", 3, MAX_LEN - 1, name, 2))


def test_every_path_has_tolerances_for_each_dtype_it_takes():
    missing = [(name, dtype) for name, path in ATTENTION_DECODE_LAYER_PATHS.items() for dtype in DTYPES
               if dtype in path.dtypes and (dtype not in ATTENTION_DECODE_LAYER.get(name, {})
                                            or dtype not in ATTENTION_DECODE_LAYER_CACHE.get(name, {}))]
    assert not missing, f"add tolerances for {missing} to model/tolerances.py (ATTENTION_DECODE_LAYER, _CACHE)"


def test_every_path_this_cpu_cannot_run_names_where_it_is_tested():
    untested = [name for name, path in ATTENTION_DECODE_LAYER_PATHS.items()
                if any(path.unavailable_reason("cpu", d) for d in path.dtypes) and name not in TESTED_ELSEWHERE]
    assert not untested, f"paths {untested} cannot run on this CPU: test them elsewhere, add to TESTED_ELSEWHERE"


def test_every_path_takes_one_token_only_and_keeps_the_cache_in_the_activation_dtype():
    for path in ATTENTION_DECODE_LAYER_PATHS.values():
        assert path.takes_tokens(1) and not path.takes_tokens(2), path.name
        assert path.state_dtype(BF16) == BF16, path.name
    assert REFERENCE.output_dtype(BF16) == F64


def _no_f16(dtype) -> str | None:
    return "this CPU build has no float16 GEMM" if dtype == F16 and not cpu_supports(F16) else None


@pytest.mark.parametrize(("name", "dtype"),
                         list(path_params(ATTENTION_DECODE_LAYER_PATHS, DTYPES, TESTED_ELSEWHERE, _no_f16)))
def test_decode_path_equals_float64_reference(name, dtype):
    path = ATTENTION_DECODE_LAYER_PATHS[name]
    check_attention_decode_path(path.fn, dtype, ATTENTION_DECODE_LAYER[name][dtype],
                                ATTENTION_DECODE_LAYER_CACHE[name][dtype], output_dtype=path.output_dtype(dtype),
                                examples=edge_cases(dtype))


def test_staged_and_reference_agree_in_float64_to_the_attention_core_bound():
    """The two float64 layers differ by their cores' and norms' association only: the core's bound holds them."""
    assert ATTENTION_DECODE_LAYER["staged"][F64] <= ATTENTION_CORES["sdpa"][F64]


@settings(max_examples=20)
@given(case=decode_cases(F32) | decode_cases(BF16) | decode_cases(F64))
def test_staged_is_gated_attention_static_bit_for_bit(case):
    x, w, cache = decode_inputs(case)
    mine, theirs = copy_cache(cache), copy_cache(cache)
    y = ATTENTION_DECODE_LAYER_PATHS["staged"].fn(x, w, mine)
    y_static, returned = gated_attention_static(x, w, theirs, core="sdpa", norm="fused")
    assert returned is theirs
    assert y.dtype == y_static.dtype and torch.equal(y, y_static), f"output not bit-equal for {case}"
    assert torch.equal(mine.k, theirs.k) and torch.equal(mine.v, theirs.v), f"cache not bit-equal for {case}"


# --- shapes and dtypes a path refuses ------------------------------------------------------------------------

def _small(batch: int = 2, length: int = 3):
    return decode_inputs(AttentionDecodeCase(2, 16, "quarter", batch, length, "float32", 7))


def test_run_refuses_more_than_one_token():
    x, w, cache = _small()
    with pytest.raises(ValueError, match=r"takes one token.*gated_attention_static takes T > 1"):
        run_attention_decode_layer("staged", torch.cat([x, x], dim=1), w, cache)
    with pytest.raises(ValueError, match=r"expected \[B, 1, 32\]"):
        run_attention_decode_layer("staged", x[..., :16], w, cache)


def test_run_refuses_a_cache_of_another_batch_or_head_layout():
    x, w, cache = _small()
    _, _, other = _small(batch=3)
    with pytest.raises(ValueError, match=r"expected \[B=2, NKV=2, max_len, D=16\].*StaticKVCache.holding"):
        run_attention_decode_layer("staged", x, w, other)
    with pytest.raises(ValueError, match="expected"):
        run_attention_decode_layer("staged", x, w, StaticKVCache(cache.k.transpose(2, 3), cache.v, cache.length))
    with pytest.raises(ValueError, match="expected"):
        run_attention_decode_layer("staged", x, w, StaticKVCache(cache.k, cache.v[:, :, :5], cache.length))


def test_run_refuses_a_length_that_is_not_a_0_dim_int64_tensor():
    x, w, cache = _small()
    for length in (cache.length.to(torch.int32), cache.length.reshape(1)):
        with pytest.raises(ValueError, match="cache.length must be a 0-dim int64 tensor"):
            run_attention_decode_layer("staged", x, w, StaticKVCache(cache.k, cache.v, length))


def test_run_refuses_a_path_that_cannot_take_the_input():
    x, w, cache = _small()
    with pytest.raises(ValueError, match="'triton' does not support T=1 torch.float64"):
        run_attention_decode_layer("triton", x.double(), w.to(F64), StaticKVCache(cache.k.double(), cache.v.double(),
                                                                                   cache.length))
    if not ATTENTION_DECODE_LAYER_PATHS["triton"].supports(1, F32, "cpu"):
        with pytest.raises(ValueError, match="'triton' does not support T=1 torch.float32 on cpu"):
            run_attention_decode_layer("triton", x, w, cache)
    with pytest.raises(KeyError, match="unknown attention decode layer path 'fast'"):
        run_attention_decode_layer("fast", x, w, cache)


def test_run_is_the_path():
    x, w, cache = _small()
    ran, direct = copy_cache(cache), copy_cache(cache)
    assert torch.equal(run_attention_decode_layer("staged", x, w, ran),
                       ATTENTION_DECODE_LAYER_PATHS["staged"].fn(x, w, direct))
    assert torch.equal(ran.k, direct.k) and torch.equal(ran.v, direct.v)


# --- the stacked projection ----------------------------------------------------------------------------------

def test_qkv_stacked_is_a_cached_copy_of_separate_projections():
    w = random_attention_weights(generator(3), AttentionDims(32, 4, 2, 16, 4, 1e4), F32)
    expected = torch.cat([w.q_proj, w.k_proj, w.v_proj])
    assert w.qkv_stacked.shape == (4 * 2 * 16 + 2 * 2 * 16, 32)
    assert torch.equal(w.qkv_stacked, expected) and w.qkv_stacked is w.qkv_stacked  # cached on the frozen object
    assert "qkv_stacked" not in w.to(F64).__dict__, "a moved copy computes its own"


def test_qkv_stacked_is_a_view_of_consecutive_rows_of_one_tensor():
    d = AttentionDims(32, 4, 2, 16, 4, 1e4)
    w = random_attention_weights(generator(4), d, F32)
    rows = torch.cat([w.q_proj, w.k_proj, w.v_proj])
    q, k, v = rows.split([w.q_proj.shape[0], w.k_proj.shape[0], w.v_proj.shape[0]])
    one = AttentionWeights(q, k, v, w.o_proj, w.q_norm, w.k_norm, d)
    assert torch.equal(one.qkv_stacked, rows)
    assert one.qkv_stacked.data_ptr() == rows.data_ptr(), "not a view"
    swapped = AttentionWeights(q, v, k, w.o_proj, w.q_norm, w.k_norm, d)  # rows out of order: a copy
    assert swapped.qkv_stacked.data_ptr() != rows.data_ptr()
    assert torch.equal(swapped.qkv_stacked, torch.cat([q, v, k]))


def test_loading_and_moving_keep_qkv_rows_of_one_tensor():
    """A checkpoint's q/k/v are loaded as rows of one tensor and moved as one, so no layer keeps a second copy."""
    d = AttentionDims(32, 4, 2, 16, 4, 1e4)
    w = random_attention_weights(generator(5), d, F32)  # three separate tensors
    loaded = AttentionWeights.from_hf_state_dict(w.to_hf_state_dict(), d)
    assert all(torch.equal(getattr(loaded, n), getattr(w, n)) for n in ("q_proj", "k_proj", "v_proj"))
    assert loaded.qkv_stacked.untyped_storage().data_ptr() == loaded.v_proj.untyped_storage().data_ptr(), "a copy"
    moved = loaded.to(F64)
    assert moved.qkv_stacked.untyped_storage().data_ptr() == moved.k_proj.untyped_storage().data_ptr(), "a copy"
    assert torch.equal(moved.qkv_stacked, torch.cat([w.q_proj, w.k_proj, w.v_proj]).double())


# --- the dispatch table's choice -----------------------------------------------------------------------------

def test_the_dispatch_table_knows_the_block():
    assert BLOCKS["attention_layer_decode"] == "batch"


@pytest.fixture
def decode_table(tmp_path, monkeypatch):
    """QWEN36_DISPATCH_TABLE pointing at a table with an `attention_layer_decode` block written from `ranges`."""
    with one_block_table(tmp_path, monkeypatch, "attention_layer_decode") as write:
        yield write


def test_choice_is_staged_without_a_table(decode_table):
    assert select_attention_decode_layer_path(1, "cpu", F32) == "staged"
    assert select_attention_decode_layer_path(256, "cpu", BF16) == "staged"


def test_choice_follows_the_table_where_it_names_a_path_that_runs(decode_table):
    decode_table([(1, 2, "reference"), (3, 8, "triton"), (9, None, "no_such_path")])
    assert select_attention_decode_layer_path(1, "cpu", F32) == "reference"
    assert select_attention_decode_layer_path(2, "cpu", F32) == "reference"
    triton_runs = ATTENTION_DECODE_LAYER_PATHS.can_run("triton", 1, F32, "cpu")
    assert select_attention_decode_layer_path(5, "cpu", F32) == ("triton" if triton_runs else "staged")
    assert select_attention_decode_layer_path(9, "cpu", F32) == "staged", "a name the table cannot run falls back"
    assert select_attention_decode_layer_path(1, "cpu", BF16) == "staged", "the table was measured in float32"


def test_served_path_is_none_where_a_core_or_norm_is_forced(decode_table):
    assert served_attention_decode_layer(2, "cpu", F32) == "staged"
    assert served_attention_decode_layer(2, "cpu", F32, decode_layer="reference") == "reference"
    assert served_attention_decode_layer(2, "cpu", F32, core="sdpa") is None
    assert served_attention_decode_layer(2, "cpu", F32, norm="fused", decode_layer="staged") is None
    decode_table([(1, None, "reference")])
    assert served_attention_decode_layer(2, "cpu", F32) == "reference"


# --- attention_static: the model's call, each choice served ---------------------------------------------------

def _spy_on_decode_paths():
    calls: list[str] = []
    spies = {n: dataclasses.replace(p, fn=lambda *a, _f=p.fn, _n=n: (calls.append(_n), _f(*a))[1])
             for n, p in ATTENTION_DECODE_LAYER_PATHS.items()}
    return calls, patch.dict(ATTENTION_DECODE_LAYER_PATHS, spies)


def test_attention_static_runs_a_decode_path_for_one_token_unless_a_core_or_norm_is_forced(decode_table):
    x, w, cache = _small()
    prefill = randn(generator(9), 2, 3, HIDDEN)
    calls, spying = _spy_on_decode_paths()
    with spying:
        served, plain = copy_cache(cache), copy_cache(cache)
        y, returned = attention_static(x, w, served)
        assert returned is served
        y_plain, _ = gated_attention_static(x, w, plain, core="sdpa", norm="fused")
        assert torch.equal(y, y_plain) and torch.equal(served.k, plain.k) and torch.equal(served.v, plain.v)
        y_ref, _ = attention_static(x, w, copy_cache(cache), decode_layer="reference")
        attention_static(x, w, copy_cache(cache), core="reference")
        attention_static(x, w, copy_cache(cache), norm="reference")
        three, three_plain = copy_cache(cache), copy_cache(cache)
        y3, _ = attention_static(prefill, w, three)
        y3_plain, _ = gated_attention_static(prefill, w, three_plain)
    assert calls == ["staged", "reference"], calls
    assert y_ref.dtype == F64
    assert torch.equal(y3, y3_plain) and torch.equal(three.k, three_plain.k)
    with pytest.raises(ValueError, match="decode_layer='staged' replaces the whole attention layer for one token"):
        attention_static(prefill, w, copy_cache(cache), decode_layer="staged")
    with pytest.raises(ValueError, match="cannot combine"):
        attention_static(x, w, copy_cache(cache), core="sdpa", decode_layer="staged")
    with pytest.raises(ValueError, match="does not support"):
        attention_static(x.double(), w.to(F64), StaticKVCache(cache.k.double(), cache.v.double(), cache.length),
                         decode_layer="triton")


def test_attention_static_takes_the_tables_path(decode_table):
    decode_table([(1, None, "reference")])
    x, w, cache = _small()
    calls, spying = _spy_on_decode_paths()
    with spying:
        y, _ = attention_static(x, w, cache)
    assert calls == ["reference"] and y.dtype == F64


# --- the kernel module, without running it -------------------------------------------------------------------

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@needs_triton
def test_rope_table_is_rope_cos_sin_in_float32_built_once():
    from model.attention.triton_decode_layer import rope_table

    cos, sin = rope_table(8, 1e7, 40, torch.device("cpu"))
    assert rope_table(8, 1e7, 40, torch.device("cpu"))[0] is cos, "built once per key"
    ref_cos, ref_sin = rope_cos_sin(torch.arange(40), 8, 1e7, F32)
    assert cos.dtype == F32 and cos.shape == (40, 4) and cos.is_contiguous()
    assert torch.equal(cos, ref_cos[:, :4]) and torch.equal(sin, ref_sin[:, :4])
    assert torch.equal(ref_cos[:, 4:], ref_cos[:, :4]), "the second half of a row repeats the first"


def test_angles_in_float32_would_be_off_at_long_positions():
    """Why the kernel reads a table computed in float64 rather than computing pos * inv_freq in float32."""
    positions = torch.arange(200_000, 200_064)
    exact, _ = rope_cos_sin(positions, 64, 1e7, F64)
    inv_freq = 1.0 / (1e7 ** (torch.arange(0, 64, 2, dtype=F32) / 64))
    in_f32 = (positions.to(F32)[:, None] * inv_freq).cos()
    assert (in_f32 - exact[:, :32]).abs().max() > 1e-3


@needs_triton
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_triton_kernel_compiles_for_hopper(dtype):
    """The interpreter runs code the compiler refuses: compile the kernel for an H200 here, no GPU needed, at the
    real per-rank dims (NH 4, NKV 1, D 256, rotary 64) with the launcher's tiles."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from model.attention import triton_decode_layer as mod

    kernel = mod._attention_decode_kernel
    if mod.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1: the kernel was defined for the interpreter")
    bd, block_s, num_warps = mod._tile(256)
    constants = {"NUM_HEADS": 4, "NUM_KV_HEADS": 1, "HEAD_DIM": 256, "HALF": 32, "BD": bd, "BLOCK_S": block_s}
    pointers = {n: f"*{dtype}" for n in ("proj_ptr", "q_norm_ptr", "k_norm_ptr", "k_cache_ptr", "v_cache_ptr",
                                         "out_ptr")}
    pointers.update(cos_ptr="*fp32", sin_ptr="*fp32", length_ptr="*i64")
    floats = {"scale": "fp32", "eps": "fp32"}
    ints = {n: "i32" for n in kernel.arg_names if n not in pointers and n not in floats and n not in constants}
    signature = {n: {**pointers, **floats, **ints, **{c: "constexpr" for c in constants}}[n] for n in kernel.arg_names}
    try:
        compiled = triton.compile(ASTSource(kernel, signature, constexprs=constants),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    except RuntimeError as exc:  # no CUDA backend or ptxas in this Triton build: nothing to learn here
        if "backend" in str(exc).lower() or "ptxas" in str(exc).lower():
            pytest.skip(f"this Triton cannot compile for CUDA here: {exc}")
        raise
    assert "cubin" in compiled.asm
