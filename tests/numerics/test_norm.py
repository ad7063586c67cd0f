"""Norm paths (model.norm.rms_norm): every registered path equals its float64 reference, and the references are what HF
computes (zero-centred `x_hat * (1 + w)`, gated `w * x_hat * silu(z)`).

The property lives here for every path and every file that checks one (`NormCase`, `norm_cases`,
`check_norm_path`): any leading shape, odd H, input magnitudes from tiny to huge, strided rows (as q is a
chunk of the q/gate projection), gates with very negative entries (silu underflows). A path that cannot
run on this CPU is skipped here with its reason and the file that runs the same property for it
(`TESTED_ELSEWHERE`): the Triton paths under Triton's interpreter (test_norm_triton_interpreter.py) and on
a GPU (test_norm_gpu.py). test_norm_checker_catches_bugs.py shows the property rejects wrong norms.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from model.dispatch.paths import PathTable
from model.norm.rms_norm import GATED_NORM_PATHS, RMS_NORM_PATHS, gated_rms_norm_reference, rms_norm_reference
from model.tolerances import NORM_PATHS
from tests.numerics.compare import assert_close, relative_error
from tests.numerics.gdn_attention_cases import generator, randn, uniform
from tests.numerics.path_checks import cpu_skip_marks, run_property

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16
DTYPES = (F64, F32, BF16, F16)
DTYPE_BY_NAME = {str(d).removeprefix("torch."): d for d in DTYPES}
SEEDS = st.integers(0, 2**32 - 1)
EPS = 1e-6
TABLES = {"zero_centred": RMS_NORM_PATHS, "gated": GATED_NORM_PATHS}
# Paths that cannot run on a plain CPU, and where the same property runs for them instead.
TESTED_ELSEWHERE = {
    "triton": "tests/numerics/test_norm_triton_interpreter.py (Triton's interpreter) and test_norm_gpu.py (CUDA)",
}
# x's magnitude, 10**k: as far out as the compute dtype allows. float32 arithmetic (every low precision)
# keeps H * x^2 between its smallest normal and its largest value for |x| in 1e-15..1e15 at H <= 300;
# float16 inputs hold 6e-5..6.5e4.
SCALE_EXPONENTS = {F64: (-30, 30), F32: (-15, 15), BF16: (-15, 15), F16: (-3, 3)}


@dataclass(frozen=True)
class NormCase:
    leading: tuple[int, ...]  # x is leading + (hidden,); () is a single row
    hidden: int
    dtype: str  # a torch dtype's name: reads well in a shrunk counterexample
    weight_dtype: str  # "same" as x, or "float32" (the norms take a weight of any float dtype)
    log10_scale: int  # x's magnitude
    gate_tail: float  # the share of z's entries (column 0 aside) drawn in -1e4..-20, where silu(z) underflows
    strided: bool  # x and z are the first half of rows twice as wide (not contiguous), as q is
    seed: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_BY_NAME[self.dtype]


def norm_cases(
    dtype: torch.dtype,
    hidden=st.integers(1, 300),
    leading=st.lists(st.integers(1, 5), max_size=3).map(tuple),
) -> st.SearchStrategy[NormCase]:
    low, high = SCALE_EXPONENTS[dtype]
    return st.builds(
        NormCase,
        leading=leading,
        hidden=hidden,
        dtype=st.just(str(dtype).removeprefix("torch.")),
        weight_dtype=st.sampled_from(["same", "float32"]),
        log10_scale=st.just(0) | st.integers(low, high),
        gate_tail=st.sampled_from([0.0, 0.3, 0.9]),
        strided=st.booleans(),
        seed=SEEDS,
    )


def norm_inputs(case: NormCase, device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, zero-centred weight near 0, gated weight near 1, z) for the case, on `device`."""
    gen = generator(case.seed)
    dtype = case.torch_dtype
    w_dtype = dtype if case.weight_dtype == "same" else DTYPE_BY_NAME[case.weight_dtype]
    width = 2 * case.hidden if case.strided else case.hidden
    x = randn(gen, *case.leading, width, dtype=dtype, scale=10.0**case.log10_scale)
    w = randn(gen, case.hidden, scale=0.3)
    z = randn(gen, *case.leading, width, scale=2.0)
    tail = uniform(gen, *z.shape, low=0.0, high=1.0) < case.gate_tail
    # Column 0 stays out of the tail: an output made only of underflowed entries measures the output
    # format (float16 rounds them to 0), not the path.
    tail[..., 0] = False
    z = torch.where(tail, -(10.0 ** uniform(gen, *z.shape, low=1.3, high=4.0)), z).to(dtype)
    x, z = (t.to(device)[..., : case.hidden] for t in (x, z))
    return x, w.to(w_dtype).to(device), (1.0 + w).to(w_dtype).to(device), z


def zero_centred_error(fn: Callable, case: NormCase, device="cpu") -> float:
    """fn's relative error against the float64 reference on the same (upcast) inputs; checks dtype and shape."""
    x, w, _, _ = norm_inputs(case, device)
    x_before = x.clone()
    ref = rms_norm_reference(x.double(), w.double(), EPS)
    out = fn(x, w, EPS)
    assert out.dtype == x.dtype and out.shape == x.shape, f"output {out.dtype} {tuple(out.shape)} for {case}"
    assert torch.equal(x, x_before), f"the norm wrote into its input for {case}"
    return relative_error(out, ref)


def gated_error(fn: Callable, case: NormCase, device="cpu") -> float:
    x, _, w, z = norm_inputs(case, device)
    x_before, z_before = x.clone(), z.clone()
    ref = gated_rms_norm_reference(x.double(), w.double(), EPS, z.double())
    out = fn(x, w, EPS, z)
    assert out.dtype == x.dtype and out.shape == x.shape, f"output {out.dtype} {tuple(out.shape)} for {case}"
    assert torch.equal(x, x_before) and torch.equal(z, z_before), f"the norm wrote into its inputs for {case}"
    return relative_error(out, ref)


ERRORS = {"zero_centred": zero_centred_error, "gated": gated_error}


def check_norm_path(
    kind: str,
    fn: Callable,
    dtype: torch.dtype,
    bound: float,
    device="cpu",
    cases=None,
    run_settings: settings | None = None,
    examples: tuple[NormCase, ...] = (),
) -> None:
    """Property: for every drawn case `fn` (a `kind` norm) is within `bound` of the float64 reference.

    Raises hypothesis's failure (the shrunk case in its report) when the path is wrong."""
    error = ERRORS[kind]

    @given(case=norm_cases(dtype) if cases is None else cases)
    def norm_matches_reference(case: NormCase) -> None:
        err = error(fn, case, device)
        note(f"{kind} {dtype}: relative error {err:.3e}")
        assert err <= bound, f"{kind} norm {dtype}: relative error {err:.3e} > {bound:.1e} for {case}"

    run_property(norm_matches_reference, examples, run_settings)


def edge_cases(dtype: torch.dtype) -> tuple[NormCase, ...]:
    """Always run: one element; a 4-D strided input; odd H past a power of two; each scale extreme; a gate
    mostly in silu's underflow."""
    name = str(dtype).removeprefix("torch.")
    low, high = SCALE_EXPONENTS[dtype]
    base = NormCase(leading=(), hidden=1, dtype=name, weight_dtype="same", log10_scale=0, gate_tail=0.0,
                    strided=False, seed=0)
    return (
        base,
        NormCase((2, 3, 4), 20, name, "float32", 0, 0.3, True, 1),
        NormCase((3,), 257, name, "same", low, 0.0, False, 2),
        NormCase((2, 1), 129, name, "float32", high, 0.9, True, 3),
    )


def _path_params(kind: str):
    """(kind, name, dtype) for each dtype a path declares; skipped, with where it is tested, where this CPU
    cannot run it."""
    for name, path in sorted(TABLES[kind].items()):
        for dtype in DTYPES:
            if dtype not in path.dtypes:
                continue
            yield pytest.param(kind, name, dtype, id=f"{kind}-{name}-{str(dtype).removeprefix('torch.')}",
                               marks=cpu_skip_marks(name, path, dtype, TESTED_ELSEWHERE))


def test_every_norm_path_has_a_tolerance_for_each_dtype_it_takes():
    missing = [
        (name, dtype)
        for table in TABLES.values()
        for name, path in table.items()
        for dtype in DTYPES
        if dtype in path.dtypes and dtype not in NORM_PATHS.get(name, {})
    ]
    assert not missing, f"add tolerances for {missing} to model/tolerances.py (NORM_PATHS)"


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_path_this_cpu_cannot_run_names_where_it_is_tested(table):
    """A skip here is not silent: the path must say where its property runs instead."""
    paths: PathTable = TABLES[table]
    untested = [
        name for name, path in paths.items()
        if any(path.unavailable_reason("cpu", d) for d in path.dtypes) and name not in TESTED_ELSEWHERE
    ]
    assert not untested, f"{table} paths {untested} cannot run on this CPU: test them elsewhere, add to TESTED_ELSEWHERE"


@pytest.mark.parametrize(("kind", "name", "dtype"), [*_path_params("zero_centred"), *_path_params("gated")])
def test_norm_path_equals_float64_reference(kind, name, dtype):
    check_norm_path(kind, TABLES[kind][name].fn, dtype, NORM_PATHS[name][dtype], examples=edge_cases(dtype))


@settings(max_examples=10)
@given(seed=SEEDS)
def test_norm_references_match_transformers(seed):
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm, Qwen3NextRMSNormGated

    gen = generator(seed)
    scale = float(torch.exp(randn(gen, 1, dtype=F64) * 2))  # row scales from ~0.02 to ~50
    x, w, z = randn(gen, 5, 16, scale=scale), randn(gen, 16, scale=0.3), randn(gen, 5, 16)
    hf = Qwen3NextRMSNorm(16, eps=EPS)
    hf_gated = Qwen3NextRMSNormGated(16, eps=EPS)
    with torch.no_grad():
        hf.weight.copy_(w)
        hf_gated.weight.copy_(1.0 + w)
        assert_close(rms_norm_reference(x, w, EPS), hf(x), NORM_PATHS["reference"][F32], "zero-centred vs HF")
        assert_close(
            gated_rms_norm_reference(x, 1.0 + w, EPS, z), hf_gated(x, z), NORM_PATHS["reference"][F32], "gated vs HF"
        )
