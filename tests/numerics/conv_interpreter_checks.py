"""The conv property (tests/numerics/test_gdn_conv.py) for the `triton` conv path, on the CPU through Triton's
interpreter, and the same property rejecting deliberately broken kernels.

Not collected by the suite itself (the file name does not start with `test_`): the interpreter must be chosen
before triton is imported, so test_gdn_conv_triton_interpreter.py runs this module in a subprocess with
TRITON_INTERPRET=1. Run it by hand the same way:

    TRITON_INTERPRET=1 python -m pytest tests/numerics/conv_interpreter_checks.py -p no:xdist

The interpreter casts float32 to bfloat16 by truncation where CUDA rounds to nearest, so bf16 outputs here are
about twice as far from the reference as compiled ones (still well inside the bound); test_gdn_conv_gpu.py
runs the property compiled.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import settings

from model.dispatch.paths import LOW_PRECISION
from model.gdn import CONV_PATHS, conv, triton_conv
from model.tolerances import GDN_CONV_PATHS
from tests.numerics.kernel_mutants import FALSIFY, load_mutant
from tests.numerics.test_gdn_conv import ConvCase, check_conv_path, conv_inputs, edge_cases

F32, BF16 = torch.float32, torch.bfloat16
PATH = CONV_PATHS["triton"]
DTYPE_IDS = {d: str(d).removeprefix("torch.") for d in LOW_PRECISION}


def test_kernel_runs_through_the_interpreter_on_cpu():
    assert triton_conv.INTERPRETED, "TRITON_INTERPRET=1 was not in effect when model.gdn.triton_conv was imported"
    assert all(PATH.supports(n, dtype, "cpu") for dtype in LOW_PRECISION for n in (1, 16384))
    assert not PATH.supports(4, torch.float64, "cpu"), "the kernel has no float64 form"
    assert not PATH.supports(4, F32, "cuda"), "interpreted kernels claim a GPU"


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=DTYPE_IDS.get)
def test_triton_path_equals_float64_reference(dtype):
    check_conv_path(PATH.fn, dtype, GDN_CONV_PATHS["triton"][dtype], examples=edge_cases(dtype),
                    run_settings=settings(max_examples=20, deadline=None))


# --- broken kernels: the module's source with one line changed ----------------------------------------------

MUTANTS = {
    # Tap j times weight column W-1-j on x's inputs: the kernel run backwards in time.
    "taps_reversed": ("j * stride_ww, mask=c_ok, other=0.0).to(tl.float32)\n        acc += xv",
                      "(W - 1 - j) * stride_ww, mask=c_ok, other=0.0).to(tl.float32)\n        acc += xv"),
    # The carried state never read: the first W-1 tokens see zeros before the chunk (a fresh sequence).
    "state_ignored": ("    if tl.program_id(2) == 0:", "    if tl.program_id(2) == -1:"),
    # x's token stride taken as C: right for a contiguous x, wrong for a column slice of the projection.
    "token_stride_is_channels": ("t.to(tl.int64)[:, None] * stride_xt + c[None, :]",
                                 "t.to(tl.int64)[:, None] * channels + c[None, :]"),
    # The new state one input too early: [state, x]'s columns T-W .. T-2 instead of T-W+1 .. T-1.
    "new_state_off_by_one": ("k_src = tokens - (W - 1) + k", "k_src = tokens - W + k"),
}


def _mutant_conv(tmp_path: Path, name: str, old: str, new: str):
    """A conv path function over a copy of model/gdn/triton_conv.py with `old` replaced by `new`."""
    module = load_mutant(triton_conv, tmp_path, name, old, new)

    def broken(x, weight, state):
        conv._check(x, weight, state)
        return module.causal_conv1d(x, weight, state)

    return broken


# A broken kernel's sums can be anything: the interpreter's numpy exp(-y) in the SiLU then overflows to inf
# (sigmoid -> 0), as it may.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_property_rejects_a_broken_kernel(name, tmp_path):
    old, new = MUTANTS[name]
    with pytest.raises(AssertionError, match="relative error|not the last W-1 inputs"):
        check_conv_path(_mutant_conv(tmp_path, name, old, new), F32, GDN_CONV_PATHS["triton"][F32],
                        run_settings=FALSIFY)


def test_the_unbroken_copy_passes(tmp_path):
    """The mutants fail for their change, not for being loaded from a copy."""
    same = _mutant_conv(tmp_path, "none", "import torch\n", "import torch\n")
    check_conv_path(same, F32, GDN_CONV_PATHS["triton"][F32], run_settings=settings(FALSIFY, max_examples=4))


def test_refuses_what_the_kernel_cannot_compute():
    x, weight, state = conv_inputs(ConvCase(1, 3, 8, 4, "float32", False, False, 0))
    with pytest.raises(TypeError, match="not torch.float64"):
        PATH.fn(x.double(), weight.double(), state.double())
