"""The attention decode layer property (tests/numerics/test_attention_decode_layer.py) for the `triton` path, on the
CPU through Triton's interpreter, and the same property rejecting deliberately broken kernels.

Not collected by the suite itself (the file name does not start with `test_`): the interpreter must be chosen
before triton is imported, so test_attention_decode_triton_interpreter.py runs this module in a subprocess with
TRITON_INTERPRET=1. Run it by hand the same way:

    TRITON_INTERPRET=1 python -m pytest tests/numerics/attention_decode_interpreter_checks.py -p no:xdist

The interpreter runs each program in numpy, about 0.1-0.4 s a call at these dims, hence few examples; the GPU file
(test_attention_decode_layer_gpu.py) runs the property compiled, at the real dims too.
"""
from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from hypothesis import Phase, settings
from hypothesis import strategies as st

from model.attention import decode_layer as attention_decode, triton_decode_layer as attention_triton_decode
from model.attention.decode_layer import ATTENTION_DECODE_LAYER_PATHS
from model.attention.layer import StaticKVCache
from model.tolerances import ATTENTION_DECODE_LAYER, ATTENTION_DECODE_LAYER_CACHE
from tests.numerics.kernel_mutants import FALSIFY, load_mutant
from tests.numerics.test_attention_decode_layer import (
    MAX_LEN,
    AttentionDecodeCase,
    check_attention_decode_path,
    copy_cache,
    decode_cases,
    decode_inputs,
    edge_cases,
)

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
PATH = ATTENTION_DECODE_LAYER_PATHS["triton"]
EXAMPLES = {F32: 12, BF16: 12, F16: 4}  # drawn examples beyond the three edge cases, per dtype


def _bounds(dtype: torch.dtype) -> tuple[float, float]:
    return ATTENTION_DECODE_LAYER["triton"][dtype], ATTENTION_DECODE_LAYER_CACHE["triton"][dtype]


def test_kernel_runs_through_the_interpreter_on_cpu():
    assert attention_triton_decode.INTERPRETED, "TRITON_INTERPRET=1 was not in effect when the kernel was defined"
    assert all(PATH.supports(1, dtype, "cpu") for dtype in (F32, BF16, F16))
    assert not PATH.supports(1, torch.float64, "cpu"), "the kernel has no float64 form"
    assert not PATH.supports(2, F32, "cpu"), "one token only"
    assert not PATH.supports(1, F32, "cuda"), "interpreted kernels claim a GPU"


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=lambda d: str(d).removeprefix("torch."))
def test_triton_path_equals_float64_reference(dtype):
    check_attention_decode_path(PATH.fn, dtype, *_bounds(dtype), examples=edge_cases(dtype),
                                run_settings=settings(max_examples=EXAMPLES[dtype]) if EXAMPLES[dtype] else
                                settings(max_examples=1, phases=[Phase.explicit]))


# --- broken kernels: the module's source with one piece changed ----------------------------------------------

MUTANTS = {
    # Rotation by -angle: q and k rotated the wrong way (q.k_new unchanged, q against the cached keys not).
    "rope_rotation_reversed": ("sign = tl.where(first, -1.0, 1.0)", "sign = tl.where(first, 1.0, -1.0)"),
    # k's RMS normalisation skipped (the (1 + w) weight kept): the key's scale is the projection's.
    "k_norm_skipped": ("k_rstd = _rstd(k_row, offs, mask, eps, HEAD_DIM)", "k_rstd = 1.0"),
    # The new token left out of the softmax (an empty cache then divides 0 by 0).
    "new_token_not_attended": ("p_new = tl.exp(s_new - m_next)", "p_new = 0.0 * tl.exp(s_new - m_next)"),
    # The new token attended twice (as if read back from the cache as well as from registers).
    "new_token_attended_twice": ("p_new = tl.exp(s_new - m_next)", "p_new = 2.0 * tl.exp(s_new - m_next)"),
    # Position `length` read from the cache too: a stale key, or the new one a second time.
    "reads_position_length": ("live = pos < prefix", "live = pos <= prefix"),
    # The output gate without its sigmoid.
    "gate_without_sigmoid": ("o = acc / l * tl.sigmoid(gate)", "o = acc / l * gate"),
}


def _mutant_core(tmp_path: Path, name: str, old: str, new: str):
    """attention_decode_core of a copy of model/attention/triton_decode_layer.py with `old` replaced by `new`."""
    return load_mutant(attention_triton_decode, tmp_path, name, old, new).attention_decode_core


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # an empty cache's 0 / 0, not attending the token
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_property_rejects_a_broken_kernel(name, tmp_path):
    old, new = MUTANTS[name]
    broken = functools.partial(attention_decode.fused_attention_layer, core=_mutant_core(tmp_path, name, old, new))
    with pytest.raises(AssertionError, match="relative error"):
        check_attention_decode_path(broken, F32, *_bounds(F32), run_settings=FALSIFY)


def test_the_unbroken_copy_passes(tmp_path):
    """The mutants fail for their change, not for being loaded from a copy."""
    same = functools.partial(attention_decode.fused_attention_layer,
                             core=_mutant_core(tmp_path, "none", "import torch\n", "import torch\n"))
    check_attention_decode_path(same, F32, *_bounds(F32), cases=decode_cases(F32, batch=st.just(2)),
                                run_settings=settings(max_examples=2, phases=[Phase.explicit, Phase.generate]))


# --- what the launcher refuses, and what it keeps ------------------------------------------------------------

def _inputs(length: int = 5):
    return decode_inputs(AttentionDecodeCase(2, 16, "half", 2, length, "float32", 0))


def test_refuses_what_the_kernel_cannot_compute():
    x, w, cache = _inputs()
    with pytest.raises(TypeError, match="not torch.float64"):
        PATH.fn(x.double(), w.to(torch.float64), copy_cache(cache))
    with pytest.raises(TypeError, match="keeps the KV cache in"):
        PATH.fn(x, w, StaticKVCache(cache.k.double(), cache.v.double(), cache.length))
    with pytest.raises(ValueError, match="0-dim int64"):
        PATH.fn(x, w, StaticKVCache(cache.k, cache.v, cache.length.to(torch.int32)))
    strided = type(w)(w.q_proj, w.k_proj, w.v_proj, w.o_proj, torch.stack([w.q_norm, w.q_norm], 1)[:, 0], w.k_norm,
                      w.dims)
    with pytest.raises(ValueError, match="reads q_norm as a contiguous vector"):
        PATH.fn(x, strided, copy_cache(cache))


def test_a_length_past_the_buffers_writes_nothing():
    """The owner refuses such a step; the kernel, which cannot raise, at least stays inside the buffers."""
    x, w, cache = _inputs()
    past = StaticKVCache(cache.k.clone(), cache.v.clone(), torch.tensor(MAX_LEN))
    PATH.fn(x, w, past)
    assert torch.equal(past.k, cache.k) and torch.equal(past.v, cache.v)


def test_one_launch_plan_per_call_shape():
    x, w, cache = _inputs()
    plans = attention_triton_decode._PLANS.of(w)
    PATH.fn(x, w, copy_cache(cache))
    PATH.fn(x, w, copy_cache(cache))
    assert len(plans) == 1, "the same call shape planned twice"
    longer = StaticKVCache(torch.zeros(2, 2, MAX_LEN + 16, 16), torch.zeros(2, 2, MAX_LEN + 16, 16), cache.length)
    PATH.fn(x, w, longer)
    assert len(plans) == 2, "another max_len is another plan (the kernel specialises on it)"
