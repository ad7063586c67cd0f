"""The two RMSNorms of model.norm.rms_norm as one Triton kernel launch each, for eager decode where launches cost most.

`rms_norm_fused` and `gated_rms_norm_fused` are several PyTorch kernels per call (casts, `1 + w`,
`F.rms_norm`, silu, multiply); eagerly, each launch costs the host tens of microseconds, far more than the
memory the norm moves. Here each call is one kernel: a program normalises BLOCK_M rows held whole in
registers (H <= MAX_HIDDEN), loading any float dtype, computing in float32 as `compute_dtype` says for
every input below float64, and storing x's dtype:

    zero-centred:  y = x * rsqrt(mean(x^2) + eps) * (1 + w)
    gated:         y = w * x * rsqrt(mean(x^2) + eps) * silu(z)
    residual add:  h_new = h + y (rounded once to h's dtype);  normed = zero-centred(h_new)

The residual add is the decode step's `h = h + y` followed by the next norm of h, in one launch where eagerly
they are about six kernels; its two outputs are bit for bit torch's `h + y` and `zero_centred_rms_norm` of that
sum. It goes through a prepared launch (model.dispatch.triton_launch), which skips the JIT's per-call binding.

Inputs are read through a row stride, so the model's strided views (q, a chunk of the q/gate projection)
are not copied; the outputs are new contiguous tensors. No host synchronisation: the launches can be
captured in a CUDA graph. Callers check shapes (model.norm.rms_norm); this module checks what only it limits.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..dispatch import triton_support
from ..dispatch.triton_launch import LaunchPlan
from ..dispatch.triton_support import defined_interpreted

__all__ = [
    "INTERPRETED",
    "MAX_HIDDEN",
    "add_zero_centred_rms_norm",
    "gated_rms_norm",
    "unavailable_reason",
    "zero_centred_rms_norm",
]

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


@triton.jit
def _round_as_torch(x, dtype: tl.constexpr):
    """float32 x rounded to `dtype` as torch rounds (to nearest, ties to even), the same bits compiled and under
    the interpreter, whose own float32 -> bfloat16 cast truncates. bfloat16 is float32's top half: add half of
    the dropped half's range, less one unless the kept last bit is odd (ties go to the even), then drop it."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
        # A NaN becomes torch's quiet NaN (the carry could turn a NaN's payload into an infinity).
        rounded = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, rounded)
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)  # float16 rounds to nearest even everywhere; float32 is x


@triton.jit(do_not_specialize=["num_rows"])
def _add_zero_centred_rms_norm_kernel(
    h_ptr, y_ptr, w_ptr, h_out_ptr, out_ptr, num_rows, hidden, stride_h, stride_y, stride_w, eps,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
):
    rows, cols, mask = _row_tile(num_rows, hidden, BLOCK_M, BLOCK_H)
    h = tl.load(h_ptr + rows[:, None] * stride_h + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    # The residual stream keeps h's dtype: the float32 sum is rounded once, as torch's h + y rounds it, and
    # that rounded sum is what the norm reads, as the unfused step's norm does.
    h_new = _round_as_torch(h + y, h_out_ptr.dtype.element_ty)
    out_at = rows[:, None] * hidden + cols[None, :]
    tl.store(h_out_ptr + out_at, h_new, mask=mask)
    w = tl.load(w_ptr + cols * stride_w, mask=cols < hidden, other=0.0).to(tl.float32)
    one_plus_w = 1.0 + w
    normed = _normalised(h_new.to(tl.float32), hidden, eps) * one_plus_w[None, :]
    tl.store(out_ptr + out_at, normed.to(out_ptr.dtype.element_ty), mask=mask)


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


# One launch plan per specialisation of the residual-add kernel (model.dispatch.triton_launch): the decode step calls it
# twice a layer with the same shapes, so the JIT's binding is paid once per key rather than on every call. The key
# holds everything the kernel specialises on (dtypes, 16-byte alignment of the inputs, every int but num_rows,
# whether num_rows needs 64 bits) and every device (a direct launch checks none); the plan adds the grid. The
# outputs are fresh allocations, always aligned. Few keys: one per H, dtype and layout the model uses.
_ADD_PLANS: dict[tuple, LaunchPlan] = {}


def _check_residual(h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> None:
    _check_input(h, "the Triton residual add + RMSNorm")
    if y.dtype != h.dtype:
        raise TypeError(f"the Triton residual add + RMSNorm adds y of h's dtype {h.dtype}, not {y.dtype}")
    if y.device != h.device or weight.device != h.device:
        raise ValueError(f"the Triton residual add + RMSNorm needs h ({h.device}), y ({y.device}) and the weight "
                         f"({weight.device}) on one device")


def add_zero_centred_rms_norm(
    h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_new, normed) in one launch: h_new = h + y rounded once to h's dtype (torch's `h + y`, bit for bit) and
    normed = h_new * rsqrt(mean(h_new^2) + eps) * (1 + w) (`zero_centred_rms_norm(h_new)`, bit for bit); h and y
    [..., H] of one dtype, weight [H]; both outputs new, contiguous, h's dtype."""
    hidden = h.shape[-1]
    h_new = torch.empty_like(h, memory_format=torch.contiguous_format)
    normed = torch.empty_like(h_new)
    if h_new.numel() == 0:
        _check_residual(h, y, weight)
        return h_new, normed
    num_rows = h_new.numel() // hidden
    (h, stride_h), (y, stride_y) = _rows(h, hidden), _rows(y, hidden)
    stride_w = weight.stride(0)
    key = (h.dtype, y.dtype, weight.dtype, h.device, y.device, weight.device, hidden, stride_h, stride_y, stride_w,
           h.data_ptr() % 16, y.data_ptr() % 16, weight.data_ptr() % 16, num_rows > 0x7FFFFFFF)
    plan = _ADD_PLANS.get(key)
    if plan is None:
        _check_residual(h, y, weight)
        _add_meta(hidden)  # refuses H > MAX_HIDDEN before a plan is kept
        plan = _ADD_PLANS[key] = LaunchPlan()
    block_m, meta = _add_meta(hidden)
    # float(eps): an int eps would specialise another variant, which the key does not tell apart.
    plan(_add_zero_centred_rms_norm_kernel, (-(-num_rows // block_m),), meta)(
        h, y, weight, h_new, normed, num_rows, hidden, stride_h, stride_y, stride_w, float(eps),
    )
    return h_new, normed


@functools.cache
def _add_meta(hidden: int) -> tuple[int, dict]:
    """(BLOCK_M, the launch's compile-time values) for rows of `hidden`, made once per H (host time per call)."""
    block_m, block_h, num_warps = _tile(hidden)
    return block_m, {"BLOCK_M": block_m, "BLOCK_H": block_h, "num_warps": num_warps}
