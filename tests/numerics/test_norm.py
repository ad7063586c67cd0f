"""Norm paths (model.norm): every registered path equals its reference, and the references are what HF
computes (zero-centred `x_hat * (1 + w)`, gated `w * x_hat * silu(z)`)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from model.norm import GATED_NORM_PATHS, RMS_NORM_PATHS, gated_rms_norm_reference, rms_norm_reference
from tests.numerics.compare import assert_close, cpu_supports
from tests.numerics.gdn_attention_cases import generator, randn
from model.tolerances import NORM_PATHS

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
DTYPES = [d for d in (F64, F32, BF16) if cpu_supports(d)]
SEEDS = st.integers(0, 2**32 - 1)
EPS = 1e-6


def norm_case(seed: int, rows: int, dim: int, dtype: torch.dtype):
    gen = generator(seed)
    scale = float(torch.exp(randn(gen, 1, dtype=torch.float64) * 2))  # row scales from ~0.02 to ~50
    return (
        randn(gen, rows, dim, dtype=dtype, scale=scale),
        randn(gen, dim, dtype=dtype, scale=0.3),
        randn(gen, rows, dim, dtype=dtype),
    )


def test_every_norm_path_has_a_tolerance():
    assert not (set(RMS_NORM_PATHS) | set(GATED_NORM_PATHS)) - set(NORM_PATHS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(RMS_NORM_PATHS))
@given(seed=SEEDS, rows=st.integers(1, 9), dim=st.sampled_from([8, 16, 64, 128]))
def test_zero_centred_rms_norm_path_equals_reference(name, dtype, seed, rows, dim):
    x, w, _ = norm_case(seed, rows, dim, dtype)
    ref = RMS_NORM_PATHS.reference.fn(x.double(), w.double(), EPS)
    out = RMS_NORM_PATHS[name].fn(x, w, EPS)
    assert out.dtype == dtype
    assert_close(out, ref, NORM_PATHS[name][dtype], f"rms norm {name} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(GATED_NORM_PATHS))
@given(seed=SEEDS, rows=st.integers(1, 9), dim=st.sampled_from([8, 16, 64, 128]))
def test_gated_rms_norm_path_equals_reference(name, dtype, seed, rows, dim):
    x, w, z = norm_case(seed, rows, dim, dtype)
    w = (1.0 + w.double()).to(dtype)  # the gated norm's weight lives around 1
    ref = GATED_NORM_PATHS.reference.fn(x.double(), w.double(), EPS, z.double())
    out = GATED_NORM_PATHS[name].fn(x, w, EPS, z)
    assert out.dtype == dtype
    assert_close(out, ref, NORM_PATHS[name][dtype], f"gated norm {name} {dtype}")


@settings(max_examples=10)
@given(seed=SEEDS)
def test_norm_references_match_transformers(seed):
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm, Qwen3NextRMSNormGated

    x, w, z = norm_case(seed, 5, 16, F32)
    hf = Qwen3NextRMSNorm(16, eps=EPS)
    hf_gated = Qwen3NextRMSNormGated(16, eps=EPS)
    with torch.no_grad():
        hf.weight.copy_(w)
        hf_gated.weight.copy_(1.0 + w)
        assert_close(rms_norm_reference(x, w, EPS), hf(x), NORM_PATHS["reference"][F32], "zero-centred vs HF")
        assert_close(
            gated_rms_norm_reference(x, 1.0 + w, EPS, z), hf_gated(x, z), NORM_PATHS["reference"][F32], "gated vs HF"
        )
