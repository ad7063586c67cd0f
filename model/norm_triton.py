"""The two RMSNorms of model.norm as one Triton kernel launch each, for eager decode where launches cost most.

`rms_norm_fused` and `gated_rms_norm_fused` are several PyTorch kernels per call (casts, `1 + w`,
`F.rms_norm`, silu, multiply); eagerly, each launch costs the host tens of microseconds, far more than the
memory the norm moves. Here each call is one kernel: a program normalises BLOCK_M rows held whole in
registers (H <= MAX_HIDDEN), loading any float dtype, computing in float32 as `compute_dtype` says for
every input below float64, and storing x's dtype:

    zero-centred:  y = x * rsqrt(mean(x^2) + eps) * (1 + w)
    gated:         y = w * x * rsqrt(mean(x^2) + eps) * silu(z)

Inputs are read through a row stride, so the model's strided views (q, a chunk of the q/gate projection)
are not copied; the output is a new contiguous tensor. No host synchronisation: the launches can be
captured in a CUDA graph. Callers check shapes (model.norm); this module checks what only it limits.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import triton_support
from .triton_support import defined_interpreted

__all__ = ["INTERPRETED", "MAX_HIDDEN", "gated_rms_norm", "unavailable_reason", "zero_centred_rms_norm"]

# A row lives whole in one program's registers: 16384 float32 over 16 warps is 32 a thread; past that, spills.
MAX_HIDDEN = 16384
# Rows per program are chosen so a program holds about this many elements: H = 128 (the GDN gated norm)
# packs 16 rows into a program, H >= 2048 takes one row a program. The rows per program depend on H alone,
# not on the row count, so serving compiles one variant per H and dtype, not one per batch size.
_TILE_ELEMENTS = 2048
_LOW_PRECISION = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _row_tile(num_rows, hidden, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr):
    """This program's rows (int64, so row * stride cannot overflow), the columns, and the in-bounds mask."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows < num_rows)[:, None] & (cols < hidden)[None, :]
    return rows, cols, mask


@triton.jit
def _normalised(x, hidden, eps):
    """x * rsqrt(mean(x^2) + eps) per row, float32; masked-off columns were loaded as 0 and add nothing."""
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / hidden + eps)
    return x * inv_rms[:, None]


# num_rows is not specialised on (a row count of 1 would otherwise compile a variant of its own).
@triton.jit(do_not_specialize=["num_rows"])
def _zero_centred_rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, num_rows, hidden, stride_x, stride_w, eps,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
):
    rows, cols, mask = _row_tile(num_rows, hidden, BLOCK_M, BLOCK_H)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols * stride_w, mask=cols < hidden, other=0.0).to(tl.float32)
    y = _normalised(x, hidden, eps) * (1.0 + w)[None, :]
    tl.store(out_ptr + rows[:, None] * hidden + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_rows"])
def _gated_rms_norm_kernel(
    x_ptr, w_ptr, z_ptr, out_ptr, num_rows, hidden, stride_x, stride_w, stride_z, eps,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
):
    rows, cols, mask = _row_tile(num_rows, hidden, BLOCK_M, BLOCK_H)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + rows[:, None] * stride_z + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols * stride_w, mask=cols < hidden, other=0.0).to(tl.float32)
    # silu(z) = z * sigmoid(z): for very negative z, sigmoid underflows to 0 and the product to -0, never NaN.
    y = w[None, :] * _normalised(x, hidden, eps) * (z * tl.sigmoid(z))
    tl.store(out_ptr + rows[:, None] * hidden + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


# Whether TRITON_INTERPRET=1 was set when the kernels were defined: then they run on CPU tensors only.
INTERPRETED = defined_interpreted(_zero_centred_rms_norm_kernel)


def unavailable_reason(device: torch.device) -> str | None:
    """None where the kernels can run: CUDA when compiled, the CPU under the interpreter."""
    return triton_support.unavailable_reason(device, INTERPRETED)


def _check_input(x: torch.Tensor, what: str) -> None:
    # Cheap attribute reads only: this runs on every eager call. The model calls path functions directly
    # (not through PathTable.checked), so a float64 input or a wrong device must stop here, not compute
    # silently in float32 or fail inside Triton's launcher.
    if x.dtype not in _LOW_PRECISION:
        raise TypeError(f"{what}: the Triton kernels take {_LOW_PRECISION}, not {x.dtype}; use the 'fused' path")
    if x.is_cuda == INTERPRETED:
        raise ValueError(f"{what} cannot run on {x.device}: {unavailable_reason(x.device)}; use the 'fused' path")


@functools.cache
def _tile(hidden: int) -> tuple[int, int, int]:
    """(BLOCK_M rows a program, BLOCK_H, num_warps) for rows of `hidden`; cached per H, because
    triton.next_power_of_2 alone costs microseconds of host time a call (it is a constexpr function)."""
    if hidden > MAX_HIDDEN:
        raise ValueError(f"a row is held whole in registers, so H <= {MAX_HIDDEN}, not {hidden}; use the 'fused' path")
    block_h = triton.next_power_of_2(hidden)
    block_m = max(1, _TILE_ELEMENTS // block_h)
    # About 8 elements a thread (16-byte bf16 loads), 1 to 16 warps.
    return block_m, block_h, min(16, max(1, block_m * block_h // 256))


def _rows(t: torch.Tensor, hidden: int) -> tuple[torch.Tensor, int]:
    """(t, its row stride) with unit column stride: t itself when contiguous (the usual case, no view made),
    else a [rows, hidden] view where the layout allows (q's chunk of the q/gate projection), else a copy."""
    if t.is_contiguous():
        return t, hidden
    rows = t.reshape(-1, hidden)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    return rows, rows.stride(0)


def zero_centred_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * (1 + w) in one launch; x [..., H], weight [H]; output contiguous, x's dtype."""
    _check_input(x, "the Triton RMSNorm")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    hidden = x.shape[-1]
    if out.numel() == 0:
        return out
    block_m, block_h, num_warps = _tile(hidden)
    num_rows = out.numel() // hidden
    x, stride_x = _rows(x, hidden)
    _zero_centred_rms_norm_kernel[(-(-num_rows // block_m),)](
        x, weight, out, num_rows, hidden, stride_x, weight.stride(0), eps,
        BLOCK_M=block_m, BLOCK_H=block_h, num_warps=num_warps,
    )
    return out


def gated_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, z: torch.Tensor) -> torch.Tensor:
    """w * x * rsqrt(mean(x^2) + eps) * silu(z) in one launch; z has x's shape; output contiguous, x's dtype."""
    _check_input(x, "the Triton gated RMSNorm")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    hidden = x.shape[-1]
    if out.numel() == 0:
        return out
    block_m, block_h, num_warps = _tile(hidden)
    num_rows = out.numel() // hidden
    (x, stride_x), (z, stride_z) = _rows(x, hidden), _rows(z, hidden)
    _gated_rms_norm_kernel[(-(-num_rows // block_m),)](
        x, weight, z, out, num_rows, hidden, stride_x, weight.stride(0), stride_z, eps,
        BLOCK_M=block_m, BLOCK_H=block_h, num_warps=num_warps,
    )
    return out
