"""The decode layer property (tests/numerics/test_gdn_decode_layer.py) for the `triton` path, on the CPU through
Triton's interpreter, and the same property rejecting deliberately broken kernels.

Not collected by the suite itself (the file name does not start with `test_`): the interpreter must be chosen
before triton is imported, so test_gdn_decode_triton_interpreter.py runs this module in a subprocess with
TRITON_INTERPRET=1. Run it by hand the same way:

    TRITON_INTERPRET=1 python -m pytest tests/numerics/gdn_decode_interpreter_checks.py -p no:xdist

The interpreter runs each program in numpy, about 0.1 s a call at these dims, hence few examples; the GPU file
(test_gdn_decode_layer_gpu.py) runs the property compiled.
"""
from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from hypothesis import Phase, settings
from hypothesis import strategies as st

from model.gdn import GDN_DECODE_LAYER_PATHS, GDNState, decode_layer, triton_decode_layer
from model.tolerances import GDN_DECODE_LAYER, GDN_DECODE_LAYER_STATE
from tests.numerics.kernel_mutants import FALSIFY, load_mutant
from tests.numerics.test_gdn_decode_layer import (
    DecodeCase, check_decode_layer_path, check_indexed_rows_equal_a_batch, decode_cases, decode_inputs, edge_cases,
)

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
PATH = GDN_DECODE_LAYER_PATHS["triton"]
EXAMPLES = {F32: 8, BF16: 8, F16: 0}  # drawn examples beyond the four edge cases, per dtype


def _bounds(dtype: torch.dtype) -> tuple[float, float]:
    return GDN_DECODE_LAYER["triton"][dtype], GDN_DECODE_LAYER_STATE["triton"][dtype]


def test_kernel_runs_through_the_interpreter_on_cpu():
    assert triton_decode_layer.INTERPRETED, "TRITON_INTERPRET=1 was not in effect when the kernel was defined"
    assert all(PATH.supports(1, dtype, "cpu") for dtype in (F32, BF16, F16))
    assert not PATH.supports(1, torch.float64, "cpu"), "the kernel has no float64 form"
    assert not PATH.supports(2, F32, "cpu"), "one token only"
    assert not PATH.supports(1, F32, "cuda"), "interpreted kernels claim a GPU"


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=lambda d: str(d).removeprefix("torch."))
def test_triton_path_equals_float64_reference_aliased_or_not(dtype):
    check_decode_layer_path(PATH.fn, dtype, *_bounds(dtype), examples=edge_cases(dtype),
                            run_settings=settings(max_examples=EXAMPLES[dtype]) if EXAMPLES[dtype] else
                            settings(max_examples=1, phases=[Phase.explicit]))


# --- broken kernels: the module's source with one line changed ----------------------------------------------

MUTANTS = {
    # torch's softplus switches to x above 20; at 2, softplus(x) - x = log1p(exp(-x)) is up to 0.13.
    "softplus_threshold_2": ("return tl.where(x > 20.0, x, log1p)", "return tl.where(x > 2.0, x, log1p)", BF16),
    # The conv taps in the wrong order: window column j times weight column W-1-j.
    "conv_taps_reversed": ("taps[None, :] * w_w,", "(W - 1 - taps[None, :]) * w_w,", BF16),
    # A decay 1e-5 too large (relative): the state, and through it the output, ~1e-5 off in float32.
    "decay_1e-5_high": ("state = state * tl.exp(g)", "state = state * (tl.exp(g) * 1.00001)", F32),
}


def _mutant_core(tmp_path: Path, name: str, old: str, new: str):
    """fused_decode_core of a copy of model/gdn/triton_decode_layer.py with `old` replaced by `new`."""
    return load_mutant(triton_decode_layer, tmp_path, name, old, new).fused_decode_core


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_property_rejects_a_broken_kernel(name, tmp_path):
    old, new, dtype = MUTANTS[name]
    broken = functools.partial(decode_layer.fused_layer, core=_mutant_core(tmp_path, name, old, new))
    with pytest.raises(AssertionError, match="relative error"):
        check_decode_layer_path(broken, dtype, *_bounds(dtype), run_settings=FALSIFY)


def test_the_unbroken_copy_passes(tmp_path):
    """The mutants fail for their change, not for being loaded from a copy."""
    same = functools.partial(decode_layer.fused_layer, core=_mutant_core(tmp_path, "none", "import torch\n", "import torch\n"))
    check_decode_layer_path(same, F32, *_bounds(F32), cases=decode_cases(F32, batch=st.just(2)),
                            run_settings=settings(max_examples=2, phases=[Phase.explicit, Phase.generate]))


def test_refuses_what_the_kernel_cannot_compute():
    x, w, state = decode_inputs(DecodeCase("group2", 2, "float32", 0))
    half_state = GDNState(state.conv, state.recurrent.half())
    with pytest.raises(TypeError, match="keeps the recurrent state in float32"):
        PATH.fn(x, w, half_state, half_state)
    with pytest.raises(TypeError, match="not torch.float64"):
        PATH.fn(x.double(), w.to(torch.float64), state, state.empty_like())


@pytest.mark.parametrize("dims", ["group2", "odd"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_indexed_state_rows_equal_a_batch(batch, dtype, dims):
    check_indexed_rows_equal_a_batch(DecodeCase(dims, batch, dtype, seed=batch))
