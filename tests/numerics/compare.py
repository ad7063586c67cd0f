"""Comparison helpers shared by the numerics tests."""
from __future__ import annotations

import torch


def relative_error(out: torch.Tensor, ref: torch.Tensor, scale: float | None = None) -> float:
    """||out - ref|| / ||ref|| in float64; inf when out has a non-finite value the reference lacks.

    `scale` replaces ||ref|| when the output is a sum of terms that can cancel: then the error is measured
    against the size of the terms (sum of their norms), which is what rounding is proportional to.
    """
    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all() and torch.isfinite(ref64).all():
        return float("inf")
    denom = ref64.norm().item() if scale is None else scale
    diff = (out64 - ref64).norm().item()
    return diff / denom if denom > 0 else diff


def poisoned_like(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """An output buffer full of NaN: a path that leaves any element unwritten cannot pass."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def assert_close(out: torch.Tensor, ref: torch.Tensor, bound: float, what: str, scale: float | None = None) -> float:
    err = relative_error(out, ref, scale)
    assert err <= bound, f"{what}: relative error {err:.3e} exceeds the bound {bound:.1e}"
    return err


def cpu_supports(dtype: torch.dtype) -> bool:
    """Whether this CPU build runs a matmul in `dtype` (float16 GEMMs are missing on some builds)."""
    try:
        torch.nn.functional.linear(torch.ones(2, 4, dtype=dtype), torch.ones(3, 4, dtype=dtype))
        torch.bmm(torch.ones(1, 2, 4, dtype=dtype), torch.ones(1, 4, 3, dtype=dtype))
    except RuntimeError:
        return False
    return True
