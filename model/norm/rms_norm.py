"""The two RMSNorms of Qwen3.5/3.6, and the residual add fused with the first, each as a reference and a fused
path, registered in one table each.

- zero-centred RMSNorm (input/post-attention/final norms, attention q_norm/k_norm):
      y = x_hat * (1 + w),  x_hat = x * rsqrt(mean(x^2) + eps)
  computed in float32 (float64 for float64 input) and cast back to x's dtype at the end, as HF and
  vLLM's GemmaRMSNorm do;
- gated RMSNorm of the GDN output (plain weight, init ones, gated by silu(z)):
      y = w * x_hat * silu(z)
  in float32 as vLLM's RMSNormGated does (HF additionally rounds x_hat to x's dtype before `* w`; that
  rounding is a no-op in float32 and float64, where the cross-checks run);
- residual add + zero-centred RMSNorm, the decode step's `h = h + y` and the norm of the new h:
      h_new = h + y  (rounded once to h's dtype: the residual stream keeps it),  normed = zero-centred(h_new)
  so `normed` is the norm of the rounded sum, as the unfused step computes it.

Paths: `fn(x, weight, eps[, z]) -> y` in x's dtype (the reference returns float64 for float64 input); the
residual add's `fn(h, y, weight, eps) -> (h_new, normed)`, both in h's dtype, y of h's shape and dtype.
`triton` (model.norm.triton_rms_norm) computes each in one kernel launch: CUDA, or a CPU through Triton's interpreter
(TRITON_INTERPRET=1); float32, bfloat16 and float16 inputs. The residual add's `triton` is bit for bit
`h + y` and the `triton` RMSNorm of that sum; its `fused` is the unfused step's `h + y` and `rms_norm_fused`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dispatch import triton_support
from ..dispatch.paths import LOW_PRECISION, ComputePath, PathTable, compute_dtype
from ..dispatch.scope import scoped
from ..dispatch.table import served_path

norm_triton = triton_support.import_if_triton(".triton_rms_norm", __package__)  # None without Triton

__all__ = [
    "NormPath",
    "RMS_NORM_PATHS",
    "GATED_NORM_PATHS",
    "ADD_RMS_NORM_PATHS",
    "compute_dtype",
    "rms_norm_reference",
    "rms_norm_fused",
    "gated_rms_norm_reference",
    "gated_rms_norm_fused",
    "rms_norm_triton",
    "gated_rms_norm_triton",
    "add_rms_norm_reference",
    "add_rms_norm_fused",
    "add_rms_norm_triton",
    "select_add_rms_norm_path",
    "triton_unavailable_reason",
]


NormPath = ComputePath  # the name this module's table records had before the generic table


def _check_weight(x: torch.Tensor, weight: torch.Tensor, what: str) -> None:
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"{what}: weight has shape {tuple(weight.shape)}; expected ({x.shape[-1]},) = x's last dim")


def _check_gate(x: torch.Tensor, z: torch.Tensor) -> None:
    if z.shape != x.shape:
        raise ValueError(f"gated_rms_norm: gate z has shape {tuple(z.shape)}; it must match x {tuple(x.shape)}")


def _check_residual(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, what: str) -> None:
    if y.shape != h.shape:
        raise ValueError(f"{what}: y has shape {tuple(y.shape)}; it must match the residual h {tuple(h.shape)}")
    if y.dtype != h.dtype:
        raise TypeError(f"{what}: y is {y.dtype}; it must have the residual h's dtype {h.dtype} (the sum keeps it)")
    _check_weight(h, weight, what)


# --- zero-centred RMSNorm --------------------------------------------------------------------------

def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * (1 + w), written out; float64 input gives float64 arithmetic."""
    _check_weight(x, weight, "rms_norm_reference")
    ct = compute_dtype(x.dtype)
    xc = x.to(ct)
    x_hat = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    return (x_hat * (1.0 + weight.to(ct))).to(x.dtype)


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """One `F.rms_norm` call with the (1 + w) weight folded in (the RMSNORM_NATIVE shape)."""
    _check_weight(x, weight, "rms_norm_fused")
    ct = compute_dtype(x.dtype)
    return F.rms_norm(x.to(ct), (x.shape[-1],), 1.0 + weight.to(ct), eps).to(x.dtype)


# --- gated RMSNorm (GDN output) ------------------------------------------------------------------

def gated_rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, z: torch.Tensor) -> torch.Tensor:
    """w * x_hat * silu(z), written out, in float32 (float64 for float64 input)."""
    _check_weight(x, weight, "gated_rms_norm_reference")
    _check_gate(x, z)
    ct = compute_dtype(x.dtype)
    xc = x.to(ct)
    x_hat = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    zc = z.to(ct)
    return (weight.to(ct) * x_hat * (zc * torch.sigmoid(zc))).to(x.dtype)


def gated_rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float, z: torch.Tensor) -> torch.Tensor:
    """`F.rms_norm` with the weight, then an in-place multiply by `F.silu(z)`: two kernels, no x_hat copy."""
    _check_weight(x, weight, "gated_rms_norm_fused")
    _check_gate(x, z)
    ct = compute_dtype(x.dtype)
    y = F.rms_norm(x.to(ct), (x.shape[-1],), weight.to(ct), eps)
    return y.mul_(F.silu(z.to(ct))).to(x.dtype)


# --- residual add + zero-centred RMSNorm -------------------------------------------------------------

def add_rms_norm_reference(
    h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """h + y summed in float32 (float64 for float64 input) and rounded once to h's dtype, then
    `rms_norm_reference` of that rounded sum, written out."""
    _check_residual(h, y, weight, "add_rms_norm_reference")
    ct = compute_dtype(h.dtype)
    h_new = (h.to(ct) + y.to(ct)).to(h.dtype)
    return h_new, rms_norm_reference(h_new, weight, eps)


def add_rms_norm_fused(
    h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the unfused decode step computes: torch's `h + y`, then `rms_norm_fused` of it (same bits)."""
    _check_residual(h, y, weight, "add_rms_norm_fused")
    h_new = h + y
    return h_new, rms_norm_fused(h_new, weight, eps)


# --- one Triton launch each (model.norm.triton_rms_norm) ----------------------------------------------------

def triton_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    return triton_support.unavailable_reason(device, None if norm_triton is None else norm_triton.INTERPRETED)


def _check_triton_installed() -> None:
    if norm_triton is None:
        raise RuntimeError("the 'triton' norm paths need Triton, which is not installed; use the 'fused' path")


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The zero-centred RMSNorm in one Triton kernel (float32 inside, x's dtype out)."""
    _check_weight(x, weight, "rms_norm_triton")
    _check_triton_installed()
    return norm_triton.zero_centred_rms_norm(x, weight, eps)


def gated_rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, z: torch.Tensor) -> torch.Tensor:
    """The gated RMSNorm in one Triton kernel (float32 inside, x's dtype out)."""
    _check_weight(x, weight, "gated_rms_norm_triton")
    _check_gate(x, z)
    _check_triton_installed()
    return norm_triton.gated_rms_norm(x, weight, eps, z)


def add_rms_norm_triton(
    h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the zero-centred RMSNorm of the sum in one Triton kernel: bit for bit `h + y` and
    `rms_norm_triton(h + y)`."""
    _check_residual(h, y, weight, "add_rms_norm_triton")
    _check_triton_installed()
    return norm_triton.add_zero_centred_rms_norm(h, y, weight, eps)


# Tests iterate these tables: a path is tested the moment it is registered. Outputs are in x's dtype.
RMS_NORM_PATHS = PathTable("RMSNorm path", [
    ComputePath("reference", rms_norm_reference, "x_hat * (1 + w), written out", is_reference=True),
    ComputePath("fused", rms_norm_fused, "F.rms_norm with 1 + w"),
    ComputePath("triton", rms_norm_triton, "one Triton kernel: x_hat * (1 + w), float32 inside",
                dtypes=LOW_PRECISION, why_unavailable=triton_unavailable_reason),
])
GATED_NORM_PATHS = PathTable("gated RMSNorm path", [
    ComputePath("reference", gated_rms_norm_reference, "w * x_hat * silu(z), written out", is_reference=True),
    ComputePath("fused", gated_rms_norm_fused, "F.rms_norm then in-place * silu(z)"),
    ComputePath("triton", gated_rms_norm_triton, "one Triton kernel: w * x_hat * silu(z), float32 inside",
                dtypes=LOW_PRECISION, why_unavailable=triton_unavailable_reason),
])
# fn(h, y, weight, eps) -> (h_new, normed), both in h's dtype.
ADD_RMS_NORM_PATHS = PathTable("residual add + RMSNorm path", [
    ComputePath("reference", add_rms_norm_reference, "h + y rounded to h's dtype, then x_hat * (1 + w), written out",
                is_reference=True),
    ComputePath("fused", add_rms_norm_fused, "h + y, then F.rms_norm with 1 + w (the unfused step's kernels)"),
    ComputePath("triton", add_rms_norm_triton, "one Triton kernel: h + y rounded once, x_hat * (1 + w) of it",
                dtypes=LOW_PRECISION, why_unavailable=triton_unavailable_reason),
])


@scoped
def select_add_rms_norm_path(
    rows: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> str:
    """The serving choice for the residual add + RMSNorm between blocks over `rows` tokens (B * T). Given the
    call's device and dtype, the device's dispatch table decides where it has a runnable entry (`add_rms_norm`);
    else `fused`, the two as the model computed them before the table had the block."""
    return served_path(ADD_RMS_NORM_PATHS, "add_rms_norm", rows, rows, device, dtype, "fused")
