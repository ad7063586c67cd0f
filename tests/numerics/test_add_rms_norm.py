"""Residual add + zero-centred RMSNorm paths (model.norm.rms_norm.ADD_RMS_NORM_PATHS):
`fn(h, y, w, eps) -> (h_new, normed)`, the decode step's `h = h + y` and the norm of the new h in one call.

The property lives here for every path and every file that checks one (`AddNormCase`, `add_norm_cases`,
`check_add_norm_path`): both outputs within the norm tolerances of the float64 reference on the same (upcast)
inputs, `h64 + y64` and its zero-centred norm; and, where a path must reproduce another computation exactly
(`bits_against`), both outputs bit for bit that computation's. Cases: any leading shape, H from 1 to a few
thousand (not a power of two), magnitudes from tiny to huge for h and y apart, y cancelling h (the sum far
under either), h and y each a strided view (the rest of each row NaN, so a read past a row is seen).

Here, on the CPU: `reference` and `fused` (which is, bit for bit, what the unfused step computes: `h + y` and
`rms_norm_fused` of it), the shape checks, and the Triton kernel compiling for an H200 (sm_90). The `triton`
path runs the same property under Triton's interpreter (add_rms_norm_interpreter_checks.py, through
test_add_rms_norm_triton_interpreter.py, with the kernel mutants it must reject) and on a GPU
(test_add_rms_norm_gpu.py), bit for bit against torch's `h + y` and the one-launch RMSNorm of that sum.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from model.dispatch.paths import LOW_PRECISION
from model.norm.rms_norm import ADD_RMS_NORM_PATHS, rms_norm_fused, rms_norm_reference
from model.tolerances import ADD_NORM_PATHS
from tests.numerics.compare import relative_error
from tests.numerics.gdn_attention_cases import generator, randn
from tests.numerics.path_checks import path_params, run_property
from tests.numerics.test_norm import DTYPE_BY_NAME, DTYPES, EPS, SCALE_EXPONENTS

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16
SEEDS = st.integers(0, 2**32 - 1)
# Paths that cannot run on a plain CPU, and where the same property runs for them instead.
TESTED_ELSEWHERE = {
    "triton": "tests/numerics/test_add_rms_norm_triton_interpreter.py (Triton's interpreter) and "
              "test_add_rms_norm_gpu.py (CUDA)",
}
# Rows past this H are drawn with one leading dim only, so an example stays small under the interpreter.
WIDE = 300
# h's and y's magnitudes, 10**k: test_norm.py's, but float16 from 1e-2: a float16 sum under 6e-5 is subnormal,
# rounded to 6e-8 absolute, and a row of one such element would measure the format, not the path.
SCALES = {**SCALE_EXPONENTS, F16: (-2, SCALE_EXPONENTS[F16][1])}


@dataclass(frozen=True)
class AddNormCase:
    leading: tuple[int, ...]  # h and y are leading + (hidden,); () is a single row
    hidden: int
    dtype: str  # a torch dtype's name: reads well in a shrunk counterexample
    weight_dtype: str  # "same" as h, or "float32"
    log10_scale: int  # h's magnitude
    log10_y_scale: int  # y's magnitude, or with `cancels` the sum's
    cancels: bool  # y = d - h for d of y's magnitude: h + y = d (up to y's rounding) cancels h
    h_strided: bool  # h is the first half of rows twice as wide (the other half NaN)
    y_strided: bool  # y likewise
    seed: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_BY_NAME[self.dtype]


@st.composite
def _shape(draw, hidden, leading) -> tuple[tuple[int, ...], int]:
    h = draw(hidden)
    if leading is None:
        leading = st.lists(st.integers(1, 5), max_size=3 if h <= WIDE else 1).map(tuple)
    return draw(leading), h


def add_norm_cases(dtype: torch.dtype, hidden=st.integers(1, WIDE) | st.integers(WIDE + 1, 4096), leading=None):
    """Cases in `dtype`; `leading` (a strategy of tuples) fixes the leading dims, else up to 3 dims of 1..5 (one
    dim past H = WIDE)."""
    low, high = SCALES[dtype]
    scale = st.just(0) | st.integers(low, high)
    return st.builds(
        lambda shape, **fields: AddNormCase(leading=shape[0], hidden=shape[1], **fields),
        shape=_shape(hidden, leading),
        dtype=st.just(str(dtype).removeprefix("torch.")),
        weight_dtype=st.sampled_from(["same", "float32"]),
        log10_scale=scale,
        log10_y_scale=scale,
        cancels=st.booleans(),
        h_strided=st.booleans(),
        y_strided=st.booleans(),
        seed=SEEDS,
    )


def _placed(t: torch.Tensor, strided: bool, device) -> torch.Tensor:
    """t on `device`; if `strided`, as the first half of rows twice as wide whose second half is NaN (a view)."""
    if not strided:
        return t.to(device)
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype)
    wide[..., : t.shape[-1]] = t
    return wide.to(device)[..., : t.shape[-1]]


def add_norm_inputs(case: AddNormCase, device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, y, zero-centred weight near 0) for the case, on `device`."""
    gen = generator(case.seed)
    dtype = case.torch_dtype
    w_dtype = dtype if case.weight_dtype == "same" else DTYPE_BY_NAME[case.weight_dtype]
    h = randn(gen, *case.leading, case.hidden, dtype=F64, scale=10.0**case.log10_scale).to(dtype)
    d = randn(gen, *case.leading, case.hidden, dtype=F64, scale=10.0**case.log10_y_scale)
    y = (d - h.double() if case.cancels else d).to(dtype)
    w = randn(gen, case.hidden, scale=0.3).to(w_dtype)
    return _placed(h, case.h_strided, device), _placed(y, case.y_strided, device), w.to(device)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b hold the same bits (NaN payloads and the sign of zero included), in the same dtype and shape."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def bit_differences(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype} {tuple(a.shape)} against {b.dtype} {tuple(b.shape)}"
    wrong = _bits(a) != _bits(b)
    first = tuple(int(i) for i in wrong.nonzero()[0])
    return (f"{int(wrong.sum())} of {a.numel()} elements differ, first at {first}: "
            f"{a[first].item()!r} != {b[first].item()!r}")


BitsAgainst = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], "tuple[torch.Tensor, torch.Tensor]"]


def run_add_norm(fn: Callable, case: AddNormCase, device="cpu", contiguous: bool = False):
    """((h, y, w), (h_new, normed), (h_new's, normed's) relative errors) of `fn` on the case, against the float64
    reference on the same (upcast) inputs: `h64 + y64` and its norm. Checks the outputs' dtype and shape, that
    the inputs are left as they were and, with `contiguous`, that both outputs are contiguous."""
    h, y, w = add_norm_inputs(case, device)
    h_before, y_before = h.clone(), y.clone()
    sum64 = h.double() + y.double()
    ref = (sum64, rms_norm_reference(sum64, w.double(), EPS))
    outs = fn(h, y, w, EPS)
    assert isinstance(outs, tuple) and len(outs) == 2, f"a residual add + norm returns (h_new, normed), not {outs!r}"
    for name, out in zip(("h_new", "normed"), outs):
        assert out.dtype == h.dtype and out.shape == h.shape, f"{name} {out.dtype} {tuple(out.shape)} for {case}"
        assert not contiguous or out.is_contiguous(), f"{name} is not contiguous (strides {out.stride()}) for {case}"
    assert same_bits(h, h_before) and same_bits(y, y_before), f"the path wrote into its inputs for {case}"
    return (h, y, w), outs, tuple(relative_error(out, r) for out, r in zip(outs, ref))


def check_add_norm_path(
    fn: Callable,
    dtype: torch.dtype,
    bound: float,
    device="cpu",
    cases=None,
    run_settings: settings | None = None,
    examples: tuple[AddNormCase, ...] = (),
    bits_against: BitsAgainst | None = None,
    contiguous: bool = False,
) -> None:
    """Property: for every drawn case both of `fn`'s outputs are within `bound` of the float64 reference and, with
    `bits_against`, bit for bit its outputs on the same inputs (checked second: a grossly wrong path reads as
    its error). With `contiguous`, both outputs must be contiguous.

    Raises hypothesis's failure (the shrunk case in its report) when the path is wrong."""

    @given(case=add_norm_cases(dtype) if cases is None else cases)
    def add_norm_matches_reference(case: AddNormCase) -> None:
        inputs, outs, errors = run_add_norm(fn, case, device, contiguous)
        note(f"{dtype}: relative error h_new {errors[0]:.3e}, normed {errors[1]:.3e}")
        for name, err in zip(("h_new", "normed"), errors):
            assert err <= bound, f"{name} {dtype}: relative error {err:.3e} > {bound:.1e} for {case}"
        if bits_against is not None:
            for name, out, want in zip(("h_new", "normed"), outs, bits_against(*inputs, EPS)):
                assert same_bits(out, want), \
                    f"{name} is not bit for bit what it must equal: {bit_differences(out, want)}; {case}"

    run_property(add_norm_matches_reference, examples, run_settings)


def edge_cases(dtype: torch.dtype) -> tuple[AddNormCase, ...]:
    """Always run: one element; a 4-D input with h strided and y cancelling it; H past a power of two at each
    scale extreme, y far from h's magnitude, both strided; a few thousand columns (not a power of two)."""
    name = str(dtype).removeprefix("torch.")
    low, high = SCALES[dtype]
    return (
        AddNormCase((), 1, name, "same", 0, 0, False, False, False, 0),
        AddNormCase((2, 3, 4), 20, name, "float32", 0, -2, True, True, False, 1),
        AddNormCase((3,), 257, name, "same", low, 0, False, False, True, 2),
        AddNormCase((2, 1), 129, name, "float32", high, low, False, True, True, 3),
        AddNormCase((2,), 3000, name, "same", 0, 0, True, False, False, 4),
    )


def fused_step(h, y, weight, eps):
    """What the decode step computed before the residual add had a table: the bits `fused` must keep."""
    s = h + y
    return s, rms_norm_fused(s, weight, eps)


def reference_step(h, y, weight, eps):
    """torch's `h + y` and the reference norm of it: the reference's bits (its sum is torch's, rounded once)."""
    s = h + y
    return s, rms_norm_reference(s, weight, eps)


# What each path must equal bit for bit on this CPU (the `triton` path's are in the interpreter and GPU files).
BITS_AGAINST = {"reference": reference_step, "fused": fused_step}


def test_every_path_has_a_tolerance_for_each_dtype_it_takes():
    missing = [(name, dtype) for name, path in ADD_RMS_NORM_PATHS.items() for dtype in DTYPES
               if dtype in path.dtypes and dtype not in ADD_NORM_PATHS.get(name, {})]
    assert not missing, f"add tolerances for {missing} to model/tolerances.py (ADD_NORM_PATHS)"


def test_every_path_this_cpu_cannot_run_names_where_it_is_tested():
    untested = [name for name, path in ADD_RMS_NORM_PATHS.items()
                if any(path.unavailable_reason("cpu", d) for d in path.dtypes) and name not in TESTED_ELSEWHERE]
    assert not untested, f"paths {untested} cannot run on this CPU: test them elsewhere, add to TESTED_ELSEWHERE"


def test_every_cpu_path_says_what_it_equals_bit_for_bit():
    cpu_paths = {name for name, path in ADD_RMS_NORM_PATHS.items() if not path.unavailable_reason("cpu", F32)}
    assert cpu_paths <= set(BITS_AGAINST), f"say what {sorted(cpu_paths - set(BITS_AGAINST))} equal in BITS_AGAINST"


@pytest.mark.parametrize(("name", "dtype"), list(path_params(ADD_RMS_NORM_PATHS, DTYPES, TESTED_ELSEWHERE)))
def test_add_norm_path_equals_float64_reference(name, dtype):
    check_add_norm_path(ADD_RMS_NORM_PATHS[name].fn, dtype, ADD_NORM_PATHS[name][dtype], examples=edge_cases(dtype),
                        bits_against=BITS_AGAINST.get(name))


@pytest.mark.parametrize(("name", "dtype"), [p for p in path_params(ADD_RMS_NORM_PATHS, DTYPES, TESTED_ELSEWHERE)
                                              if p.values[1] in (F64, BF16)])
def test_zero_rows_give_empty_outputs(name, dtype):
    for shape in [(0, 16), (0, 3, 2048), (2, 0, 5)]:
        h = torch.empty(shape, dtype=dtype)
        h_new, normed = ADD_RMS_NORM_PATHS[name].fn(h, h.clone(), torch.ones(shape[-1], dtype=dtype), EPS)
        assert h_new.shape == normed.shape == h.shape and h_new.dtype == normed.dtype == dtype


@pytest.mark.parametrize("name", sorted(ADD_RMS_NORM_PATHS))
def test_refuses_mismatched_shapes_and_dtypes(name):
    """The shape checks run before anything else, so the `triton` path gives them here too (no Triton needed)."""
    fn = ADD_RMS_NORM_PATHS[name].fn
    h, w = torch.ones(2, 3, 8), torch.zeros(8)
    with pytest.raises(ValueError, match=r"y has shape \(2, 8\); it must match the residual h \(2, 3, 8\)"):
        fn(h, torch.ones(2, 8), w, EPS)
    with pytest.raises(ValueError, match=r"weight has shape \(9,\); expected \(8,\)"):
        fn(h, torch.ones(2, 3, 8), torch.zeros(9), EPS)
    with pytest.raises(ValueError, match=r"weight has shape \(1, 8\)"):
        fn(h, torch.ones(2, 3, 8), torch.zeros(1, 8), EPS)
    with pytest.raises(TypeError, match=r"y is torch.bfloat16; it must have the residual h's dtype torch.float32"):
        fn(h, torch.ones(2, 3, 8, dtype=BF16), w, EPS)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize(("dtype", "hidden"), [("bf16", 2048), ("fp32", 2048), ("fp16", 129)])
def test_the_triton_kernel_compiles_for_hopper(dtype, hidden):
    """The interpreter runs code the compiler refuses: compile the kernel for an H200 here, no GPU needed, with
    the launcher's tiles (H = 2048: one row a program; H = 129: 8 rows a program, masked columns)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from model.norm import triton_rms_norm as norm_triton

    kernel = norm_triton._add_zero_centred_rms_norm_kernel
    if norm_triton.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1: the kernel was defined for the interpreter")
    block_m, meta = norm_triton._add_meta(hidden)
    constants = {"BLOCK_M": block_m, "BLOCK_H": meta["BLOCK_H"]}
    pointers = {n: f"*{dtype}" for n in ("h_ptr", "y_ptr", "w_ptr", "h_out_ptr", "out_ptr")}
    scalars = {n: "fp32" if n == "eps" else "i32" for n in kernel.arg_names if n not in pointers and n not in constants}
    signature = {**pointers, **scalars, **{n: "constexpr" for n in constants}}
    assert list(signature) == kernel.arg_names, "the signature lost or misnamed an argument"
    try:
        compiled = triton.compile(ASTSource(kernel, signature, constexprs=constants),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": meta["num_warps"]})
    except RuntimeError as exc:  # no CUDA backend or ptxas in this Triton build: nothing to learn here
        if "backend" in str(exc).lower() or "ptxas" in str(exc).lower():
            pytest.skip(f"this Triton cannot compile for CUDA here: {exc}")
        raise
    assert "cubin" in compiled.asm


def test_the_triton_path_takes_the_low_precisions_only():
    path = ADD_RMS_NORM_PATHS["triton"]
    assert path.dtypes == LOW_PRECISION and not path.is_reference
    assert ADD_RMS_NORM_PATHS.reference.name == "reference"
