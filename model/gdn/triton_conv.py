"""The GDN short convolution (model.gdn.conv: depthwise causal conv1d + SiLU with a carried state) in one Triton
kernel launch.

The `prefill` path concatenates [state, x], casts it to float32, runs a grouped `F.conv1d`, SiLU, a transpose
and a cast back: several kernels and several passes over a T x C activation, about 30x its HBM floor at
T = 16384. Here a program takes BLOCK_T tokens x BLOCK_C channels of one sequence and sums the W taps in
float32: tap j of token t reads input t + j - (W-1), which for the first W-1 tokens of the call lies before x
and is read from the carried state's column t + j instead. x is read through its batch and token strides (it
is usually a column slice of the projection output, left uncopied); its channels must have unit stride. The
programs of the last token tile also write the new state, the last W-1 columns of [state, x]: one launch per
call, no host synchronisation (capturable), any T >= 1.

Each output element reads W inputs, but neighbouring tokens share them, so a tile's reads hit L1/L2 after the
first: HBM sees x read once and y written once.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..dispatch import triton_support
from ..dispatch.triton_support import defined_interpreted, last_dim_contiguous

__all__ = ["INTERPRETED", "causal_conv1d", "unavailable_reason"]

_LOW_PRECISION = (torch.float32, torch.bfloat16, torch.float16)
# Tiles of 16 tokens x 64 channels over 2 warps, whatever T (one compiled variant per dtype and kernel width).
# Measured on the H200 (2026-12-04, triton 3.6, do_bench, C = 2048, W = 4) among 4..128 tokens x 64..256
# channels x 2..8 warps: 69 us at T = 16384 in bf16 (a copy of x takes 37, the HBM floor of read + write is
# 28; `prefill` 911), 21 us at T = 4096, and the fastest in float32 (89 us); 64 x 128 tiles took 86 us.
_BLOCK_T, _BLOCK_C, _NUM_WARPS = 16, 64, 2


# `tokens` is not specialised on (T = 1 would otherwise compile a variant of its own).
@triton.jit(do_not_specialize=["tokens"])
def _causal_conv1d_kernel(
    x_ptr, w_ptr, state_ptr, y_ptr, new_state_ptr,
    tokens, channels,
    stride_xb, stride_xt, stride_wc, stride_ww, stride_sb, stride_sc, stride_sw,
    W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    t = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)
    c_ok = c < channels
    t_ok = t < tokens
    x_seq = x_ptr + b * stride_xb
    s_seq = state_ptr + b * stride_sb
    x_tile = x_seq + t.to(tl.int64)[:, None] * stride_xt + c[None, :]  # this tile's own inputs
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(W):  # tap j of token t reads input t + j - (W-1): a whole tile, shifted up
        shift = j - (W - 1)
        rows_ok = t_ok & (t + shift >= 0)
        xv = tl.load(x_tile + shift * stride_xt, mask=rows_ok[:, None] & c_ok[None, :], other=0.0)
        tap = tl.load(w_ptr + c * stride_wc + j * stride_ww, mask=c_ok, other=0.0).to(tl.float32)
        acc += xv.to(tl.float32) * tap[None, :]
    if tl.program_id(2) == 0:
        # The taps that reach before the chunk (input t + j - (W-1) < 0) read the carried state's column t + j;
        # only the first token tile has such taps, so only its programs load the state.
        for j in tl.static_range(W - 1):
            col = t + j
            in_state = t_ok & (col < W - 1)
            sv = tl.load(s_seq + c[None, :] * stride_sc + col[:, None] * stride_sw,
                         mask=in_state[:, None] & c_ok[None, :], other=0.0)
            tap = tl.load(w_ptr + c * stride_wc + j * stride_ww, mask=c_ok, other=0.0).to(tl.float32)
            acc += sv.to(tl.float32) * tap[None, :]
    y = acc * tl.sigmoid(acc)
    rows = b * tokens + t.to(tl.int64)
    tl.store(y_ptr + rows[:, None] * channels + c[None, :], y.to(y_ptr.dtype.element_ty),
             mask=t_ok[:, None] & c_ok[None, :])
    if tl.program_id(2) == tl.num_programs(2) - 1:
        # New state column k is input T - (W-1) + k of [state, x]: x's token where that is >= 0, else the old
        # state's column T + k (a call shorter than W-1 tokens keeps part of the old window).
        # (Names of their own: compiled Triton refuses a variable redefined in a branch with another shape.)
        k = tl.arange(0, BLOCK_S)
        k_src = tokens - (W - 1) + k
        k_in_x = k_src >= 0
        k_ok = k < W - 1
        from_x = tl.load(x_seq + k_src.to(tl.int64)[None, :] * stride_xt + c[:, None],
                         mask=c_ok[:, None] & (k_in_x & k_ok)[None, :], other=0.0)
        from_state = tl.load(s_seq + c[:, None] * stride_sc + (k_src + (W - 1))[None, :] * stride_sw,
                             mask=c_ok[:, None] & ((k_src < 0) & k_ok)[None, :], other=0.0)
        kept = new_state_ptr.dtype.element_ty  # copies of inputs: cast straight to the state's dtype, no detour
        window = tl.where(k_in_x[None, :], from_x.to(kept), from_state.to(kept))
        tl.store(new_state_ptr + b * channels * (W - 1) + c[:, None] * (W - 1) + k[None, :], window,
                 mask=c_ok[:, None] & k_ok[None, :])


# Whether TRITON_INTERPRET=1 was set when the kernel was defined: then it runs on CPU tensors only.
INTERPRETED = defined_interpreted(_causal_conv1d_kernel)


def unavailable_reason(device: torch.device) -> str | None:
    """None where the kernel can run: CUDA when compiled, the CPU under the interpreter."""
    return triton_support.unavailable_reason(device, INTERPRETED)


@functools.cache
def _state_block(kernel: int) -> int:
    # cached: triton.next_power_of_2 costs microseconds of host time a call
    return triton.next_power_of_2(kernel - 1)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu(causal conv of [state, x]) [B, T, C] in x's dtype, the new state [B, C, W-1] in conv_state's dtype)
    for x [B, T, C], weight [C, W], conv_state [B, C, W-1] (shapes checked by the caller, model.gdn.conv).
    conv_state is only read."""
    # Cheap attribute reads only (this runs on every eager call): a float64 input or the wrong device must stop
    # here, not compute in float32 silently or fail inside Triton's launcher.
    if x.dtype not in _LOW_PRECISION:
        raise TypeError(f"the Triton conv takes {_LOW_PRECISION}, not {x.dtype}; use the 'prefill' path")
    if x.is_cuda == INTERPRETED:
        raise ValueError(f"the Triton conv cannot run on {x.device}: {unavailable_reason(x.device)}; "
                         "use the 'prefill' path")
    batch, tokens, channels = x.shape
    kernel = weight.shape[1]
    if tokens < 1 or not 2 <= kernel <= _BLOCK_T + 1:
        # Only the first token tile reads the carried state, so the state's W-1 columns must fit in one tile.
        raise ValueError(f"the Triton conv needs T >= 1 and 2 <= W <= {_BLOCK_T + 1} taps, not T={tokens}, "
                         f"W={kernel}; use the 'prefill' path")
    x = last_dim_contiguous(x)
    y = torch.empty((batch, tokens, channels), dtype=x.dtype, device=x.device)
    new_state = torch.empty(conv_state.shape, dtype=conv_state.dtype, device=conv_state.device)
    grid = (batch, triton.cdiv(channels, _BLOCK_C), triton.cdiv(tokens, _BLOCK_T))
    _causal_conv1d_kernel[grid](
        x, weight, conv_state, y, new_state, tokens, channels,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        conv_state.stride(0), conv_state.stride(1), conv_state.stride(2),
        W=kernel, BLOCK_T=_BLOCK_T, BLOCK_C=_BLOCK_C, BLOCK_S=_state_block(kernel),
        num_warps=_NUM_WARPS,
    )
    return y, new_state
