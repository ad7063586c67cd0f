"""The GDN short convolution: depthwise causal conv1d (no bias) + SiLU, with a carried state.

The conv state of a sequence is its last W-1 *inputs* (pre-activation channels), layout [B, C, W-1] (vLLM's
older orientation; HF keeps W columns, one of them redundant). A prefill starts from the state of the
previous chunk (zeros for a fresh sequence) and a decode step shifts one token in.

Calling convention: `fn(x [B, T, C], weight [C, W], conv_state [B, C, W-1]) -> (y [B, T, C], new_state)`,
y in x's dtype (float32 arithmetic; float64 for float64 input), new_state in conv_state's dtype.
The input state is never modified. `triton` (model.gdn.triton_conv) is the whole call in one kernel launch:
CUDA, or a CPU through Triton's interpreter (TRITON_INTERPRET=1); float32, bfloat16 and float16 inputs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dispatch import triton_support
from ..dispatch.paths import LOW_PRECISION, ComputePath, PathTable, always_float64, compute_dtype

triton_conv = triton_support.import_if_triton(".triton_conv", __package__)  # None without Triton

__all__ = [
    "ConvPath",
    "CONV_PATHS",
    "conv_reference",
    "conv_prefill",
    "conv_update",
    "conv_triton",
    "zero_conv_state",
    "run_conv_path",
]


ConvPath = ComputePath  # the name this module's table records had before the generic table


def zero_conv_state(batch: int, channels: int, kernel: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    return torch.zeros(batch, channels, kernel - 1, dtype=dtype, device=device)


def _check(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor) -> None:
    if x.dim() != 3:
        raise ValueError(f"conv input has shape {tuple(x.shape)}; expected [B, T, C]")
    channels, kernel = weight.shape
    if x.shape[2] != channels:
        raise ValueError(f"conv input has {x.shape[2]} channels but the weight has {channels} (weight is [C, W])")
    expected = (x.shape[0], channels, kernel - 1)
    if tuple(conv_state.shape) != expected:
        raise ValueError(
            f"conv_state has shape {tuple(conv_state.shape)}; expected [B, C, W-1] = {expected} "
            "(transpose a [B, W-1, C] state, or drop the oldest column of HF's [B, C, W] state)"
        )


def conv_reference(x, weight, conv_state):
    """The definition: y_t = silu(sum_j w[:, j] * u[t + j]) over u = [state, x], in float64."""
    _check(x, weight, conv_state)
    kernel = weight.shape[1]
    u = torch.cat([conv_state.double(), x.double().transpose(1, 2)], dim=2)  # [B, C, W-1+T]
    w = weight.double()
    y = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for t in range(x.shape[1]):
        y[:, t] = (u[:, :, t : t + kernel] * w).sum(-1)
    return F.silu(y), u[:, :, u.shape[2] - (kernel - 1) :].to(conv_state.dtype)


def conv_prefill(x, weight, conv_state):
    """Any T: one grouped `F.conv1d` over [state, x] with no padding (the state is the left padding)."""
    _check(x, weight, conv_state)
    ct = compute_dtype(x.dtype)
    kernel = weight.shape[1]
    u = torch.cat([conv_state.to(ct), x.to(ct).transpose(1, 2)], dim=2)
    y = F.conv1d(u, weight.to(ct).unsqueeze(1), groups=weight.shape[0])  # [B, C, T]
    new_state = u[:, :, u.shape[2] - (kernel - 1) :].to(conv_state.dtype)
    return F.silu(y).transpose(1, 2).to(x.dtype), new_state


def conv_update(x, weight, conv_state):
    """T == 1 (decode): shift the token into the window, one multiply-add over W taps."""
    _check(x, weight, conv_state)
    ct = compute_dtype(x.dtype)
    window = torch.cat([conv_state.to(ct), x.to(ct).transpose(1, 2)], dim=2)  # [B, C, W]
    y = F.silu((window * weight.to(ct)).sum(-1))
    return y.unsqueeze(1).to(x.dtype), window[:, :, 1:].to(conv_state.dtype)


def conv_triton(x, weight, conv_state):
    """Any T: one Triton launch writes y and the new state (float32 taps, SiLU; model.gdn.triton_conv)."""
    _check(x, weight, conv_state)
    if triton_conv is None:
        raise RuntimeError("the 'triton' conv path needs Triton, which is not installed; use the 'prefill' path")
    return triton_conv.causal_conv1d(x, weight, conv_state)


def triton_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    return triton_support.unavailable_reason(device, None if triton_conv is None else triton_conv.INTERPRETED)


# Tests iterate this table: a path is tested the moment it is registered (tolerances: model.tolerances).
CONV_PATHS = PathTable("conv path", [
    ComputePath("reference", conv_reference, "explicit window sum in float64", is_reference=True,
                output_dtype_rule=always_float64),
    ComputePath("prefill", conv_prefill, "grouped F.conv1d over [state, x]"),
    ComputePath("update", conv_update, "T == 1 window shift", max_tokens=1),
    ComputePath("triton", conv_triton, "one Triton kernel: float32 taps, SiLU, the new state",
                dtypes=LOW_PRECISION, why_unavailable=triton_unavailable_reason),
])


def run_conv_path(name: str, x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor):
    return CONV_PATHS.checked(name, x.shape[1], x.dtype, x.device).fn(x, weight, conv_state)
