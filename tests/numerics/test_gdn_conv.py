"""Causal conv1d paths (model.gdn.CONV_PATHS): equal to the float64 window sum, and the carried conv state
makes a split prefill and per-token updates equal one pass.

The property lives here for every path and every file that checks one (`ConvCase`, `conv_cases`,
`check_conv_path`): T from 1 past several token tiles of the Triton kernel, channel counts past its channel tile,
kernels of 2..5 taps, x a column slice of a wider projection output (as the layer's q/k/v are) and a
transposed conv state. A path that cannot run on this CPU is skipped here with its reason and the file that
runs the same property for it (`TESTED_ELSEWHERE`).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from model.gdn import CONV_PATHS, run_conv_path
from model.tolerances import GDN_CONV_PATHS, GDN_HANDOVER
from tests.numerics.compare import assert_close, cpu_supports, relative_error
from tests.numerics.gdn_attention_cases import generator, randn
from tests.numerics.path_checks import path_params, run_property

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16
DTYPES = [d for d in (F64, F32, BF16) if cpu_supports(d)]
DTYPE_BY_NAME = {str(d).removeprefix("torch."): d for d in (F64, F32, BF16, F16)}
SEEDS = st.integers(0, 2**32 - 1)
CHANNELS = 24
# Paths that cannot run on a plain CPU, and where the same property runs for them instead.
TESTED_ELSEWHERE = {
    "triton": "tests/numerics/test_gdn_conv_triton_interpreter.py (Triton's interpreter) and "
              "test_gdn_conv_gpu.py (CUDA)",
}


@dataclass(frozen=True)
class ConvCase:
    batch: int
    tokens: int
    channels: int
    kernel: int
    dtype: str  # a torch dtype's name: reads well in a shrunk counterexample
    x_slice: bool  # x is columns 5..5+C of a wider [B, T, C + 9] tensor (token stride != C), as q/k/v are
    state_transposed: bool  # the state is a [B, W-1, C] tensor transposed (channel stride 1)
    seed: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_BY_NAME[self.dtype]


def conv_cases(dtype: torch.dtype, max_tokens: int | None = None, channels=st.sampled_from((3, CHANNELS, 130)),
               tokens=st.integers(1, 70)) -> st.SearchStrategy[ConvCase]:
    """T up to 70 (five 16-token tiles of the Triton kernel), C up to 130 (three 64-channel tiles), W 2..5,
    both layouts."""
    if max_tokens is not None:
        tokens = tokens.map(lambda t: min(t, max_tokens))
    return st.builds(ConvCase, batch=st.integers(1, 2), tokens=tokens, channels=channels,
                     kernel=st.integers(2, 5), dtype=st.just(str(dtype).removeprefix("torch.")),
                     x_slice=st.booleans(), state_transposed=st.booleans(), seed=SEEDS)


def conv_inputs(case: ConvCase, device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x [B, T, C], weight [C, W], state [B, C, W-1]) in the case's dtype and layouts, on `device`."""
    gen, dtype = generator(case.seed), case.torch_dtype
    b, t, c, w = case.batch, case.tokens, case.channels, case.kernel
    x = randn(gen, b, t, c + 9, dtype=dtype)[:, :, 5 : 5 + c] if case.x_slice else randn(gen, b, t, c, dtype=dtype)
    weight = randn(gen, c, w, dtype=dtype, scale=0.5)
    state = randn(gen, b, w - 1, c, dtype=dtype).transpose(1, 2) if case.state_transposed else \
        randn(gen, b, c, w - 1, dtype=dtype)
    return x.to(device), weight.to(device), state.to(device)


def conv_error(fn: Callable, case: ConvCase, device="cpu", output_dtype: torch.dtype | None = None) -> float:
    """The output's relative error against the float64 reference; asserts the output's dtype (default: x's) and
    shape and the state parts exactly."""
    x, weight, state = conv_inputs(case, device)
    before = state.clone()
    ref_y, ref_state = run_conv_path(CONV_PATHS.reference.name, x.double(), weight.double(), state.double())
    y, new_state = fn(x, weight, state)
    assert torch.equal(state, before), f"the conv path modified the incoming state for {case}"
    assert y.dtype == (output_dtype or x.dtype) and y.shape == x.shape, f"output {y.dtype} {tuple(y.shape)} for {case}"
    # The new state is a copy of inputs: exact, whatever the dtype.
    assert new_state.dtype == state.dtype and torch.equal(new_state, ref_state.to(new_state.dtype)), \
        f"the new state is not the last W-1 inputs of [state, x] for {case}"
    return relative_error(y, ref_y)


def check_conv_path(fn: Callable, dtype: torch.dtype, bound: float, device="cpu", cases=None,
                    run_settings: settings | None = None, examples: tuple[ConvCase, ...] = (),
                    output_dtype: torch.dtype | None = None) -> None:
    """Property: for every drawn case `fn` (a conv path's function) is within `bound` of the float64 window
    sum, its new state is exactly the last W-1 inputs and the input state is untouched. Raises hypothesis's
    failure (the shrunk case in its report) when the path is wrong."""

    @given(case=conv_cases(dtype) if cases is None else cases)
    def conv_matches_reference(case: ConvCase) -> None:
        err = conv_error(fn, case, device, output_dtype)
        note(f"conv {dtype}: relative error {err:.3e}")
        assert err <= bound, f"conv {dtype}: relative error {err:.3e} > {bound:.1e} for {case}"

    run_property(conv_matches_reference, examples, run_settings)


def edge_cases(dtype: torch.dtype) -> tuple[ConvCase, ...]:
    """Always run: one token (the state feeds all W-1 earlier taps), fewer tokens than the window (the new state
    keeps old columns), and the Triton kernel's tile boundaries crossed in tokens (65) and channels (130), sliced."""
    name = str(dtype).removeprefix("torch.")
    return (
        ConvCase(1, 1, CHANNELS, 4, name, False, False, 0),
        ConvCase(2, 2, 3, 5, name, True, True, 1),
        ConvCase(1, 65, 130, 4, name, True, False, 2),
    )


def test_every_conv_path_has_a_tolerance_for_each_dtype_it_takes():
    missing = [(name, d) for name, path in CONV_PATHS.items() for d in DTYPES
               if d in path.dtypes and d not in GDN_CONV_PATHS.get(name, {})]
    assert not missing, f"add the conv paths' tolerances {missing} to model/tolerances.py (GDN_CONV_PATHS)"


def test_every_conv_path_this_cpu_cannot_run_names_where_it_is_tested():
    """A skip here is not silent: the path must say where its property runs instead."""
    untested = [name for name, path in CONV_PATHS.items()
                if any(path.unavailable_reason("cpu", d) for d in path.dtypes) and name not in TESTED_ELSEWHERE]
    assert not untested, f"conv paths {untested} cannot run on this CPU: test them elsewhere, add to TESTED_ELSEWHERE"


@pytest.mark.parametrize(("name", "dtype"), list(path_params(CONV_PATHS, DTYPES, TESTED_ELSEWHERE)))
def test_conv_path_equals_window_sum(name, dtype):
    path = CONV_PATHS[name]
    check_conv_path(lambda x, w, s: run_conv_path(name, x, w, s), dtype, GDN_CONV_PATHS[name][dtype],
                    cases=conv_cases(dtype, path.max_tokens), run_settings=settings(max_examples=30),
                    output_dtype=path.output_dtype(dtype),
                    examples=tuple(c for c in edge_cases(dtype) if path.takes_tokens(c.tokens)))


def conv_case(seed: int, batch: int, tokens: int, kernel: int, dtype: torch.dtype):
    return conv_inputs(ConvCase(batch, tokens, CHANNELS, kernel, str(dtype).removeprefix("torch."), False, False, seed))


@given(seed=SEEDS, tokens=st.integers(2, 40), kernel=st.integers(2, 5), data=st.data())
def test_conv_split_prefill_with_state_equals_one_pass(seed, tokens, kernel, data):
    """Includes splits shorter than the window: the state must then mix old state and new inputs."""
    split = data.draw(st.integers(1, tokens - 1), label="split")
    x, weight, state = conv_case(seed, 1, tokens, kernel, F32)
    whole, whole_state = run_conv_path("prefill", x, weight, state)
    first, mid = run_conv_path("prefill", x[:, :split], weight, state)
    second, end = run_conv_path("prefill", x[:, split:], weight, mid)
    assert_close(torch.cat([first, second], 1), whole, GDN_HANDOVER[F32], f"conv split {split}/{tokens}")
    assert torch.equal(end, whole_state)


@given(seed=SEEDS, tokens=st.integers(1, 20), kernel=st.integers(2, 5))
def test_conv_updates_equal_prefill(seed, tokens, kernel):
    x, weight, state = conv_case(seed, 2, tokens, kernel, F32)
    whole, whole_state = run_conv_path("prefill", x, weight, state)
    ys = []
    for t in range(tokens):
        y, state = run_conv_path("update", x[:, t : t + 1], weight, state)
        ys.append(y)
    assert_close(torch.cat(ys, 1), whole, GDN_HANDOVER[F32], f"{tokens} conv updates")
    assert torch.equal(state, whole_state)


def test_conv_names_the_state_layout_on_a_mismatch():
    x, weight, state = conv_case(0, 1, 3, 4, F32)
    with pytest.raises(ValueError, match=r"\[B, C, W-1\]"):
        run_conv_path("prefill", x, weight, state.transpose(1, 2))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_triton_kernel_compiles_for_hopper(dtype):
    """The interpreter runs code the compiler refuses (a variable redefined in a branch with another shape was
    one): compile the kernel for an H200 here, no GPU needed, with the launcher's tiles."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from model.gdn import triton_conv

    kernel = triton_conv._causal_conv1d_kernel
    if triton_conv.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1: the kernel was defined for the interpreter")
    pointers = {n: f"*{dtype}" for n in ("x_ptr", "w_ptr", "state_ptr", "y_ptr", "new_state_ptr")}
    ints = {n: "i32" for n in kernel.arg_names if n not in pointers and n not in ("W", "BLOCK_T", "BLOCK_C", "BLOCK_S")}
    constants = {"W": 4, "BLOCK_T": triton_conv._BLOCK_T, "BLOCK_C": triton_conv._BLOCK_C, "BLOCK_S": 4}
    signature = {**pointers, **ints, **{n: "constexpr" for n in constants}}
    try:
        compiled = triton.compile(ASTSource(kernel, signature, constexprs=constants),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": triton_conv._NUM_WARPS})
    except RuntimeError as exc:  # no CUDA backend or ptxas in this Triton build: nothing to learn here
        if "backend" in str(exc).lower() or "ptxas" in str(exc).lower():
            pytest.skip(f"this Triton cannot compile for CUDA here: {exc}")
        raise
    assert "cubin" in compiled.asm
