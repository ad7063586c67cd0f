"""The GDN layer for one token (T == 1, the decode step), as a table of whole-layer paths.

At decode the layer moves little data and its cost is kernel launches (eagerly ~20-30 us of host time each):
the staged layer launches ~20. A path here computes the whole layer, so it can fuse across the blocks.

Calling convention: `fn(x [B, 1, hidden], w: GDNWeights, state: GDNState, out_state: GDNState) -> y [B, 1, hidden]`,
y in x's dtype (the reference's in float64). The path writes the state after the token into `out_state`,
overwriting every element. `out_state` may be `state` itself (the in-place update a capturable decode step
needs) and every path gives the same result aliased or not; when it is another state, `state` is left unchanged.

- `reference`: every block's reference path, in float64 on the upcast inputs (the definition);
- `staged`: the blocks one after another, each block's serving choice (`select_conv_path`, `select_rule_path`,
  `select_gated_norm_path`: with no dispatch table, conv `update`, `decode_step` and the `fused` gated norm, bit
  for bit what `gdn_layer` computed for one token before this table), then copied into `out_state`;
- `triton`: three launches: one GEMM for the four input projections (`GDNWeights.in_proj_stacked`), one Triton
  kernel for conv, gating, the delta rule and the gated norm (model.gdn.triton_decode_layer, float32 on chip),
  and out_proj. CUDA, or a CPU through Triton's interpreter (TRITON_INTERPRET=1).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dispatch import triton_support
from ..dispatch.paths import LOW_PRECISION, ComputePath, PathTable, always_float64
from ..dispatch.scope import scoped
from ..dispatch.table import served_path
from ..norm.rms_norm import GATED_NORM_PATHS
from .conv import CONV_PATHS
from .rule import GDN_RULE_PATHS
from .staged import staged_layer

triton_decode_layer = triton_support.import_if_triton(".triton_decode_layer", __package__)  # None: no Triton

__all__ = [
    "GDN_DECODE_LAYER_PATHS",
    "decode_layer_reference",
    "decode_layer_staged",
    "decode_layer_triton",
    "fused_layer",
    "run_decode_layer",
    "select_decode_layer_path",
]


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def decode_layer_reference(x, w, state, out_state):
    """The definition: the layer from every block's reference path, in float64 (inputs upcast, nothing rounded)."""
    f64 = torch.float64
    y, conv_state, recurrent = staged_layer(
        x.to(f64), w.to(f64), state.conv.to(f64), state.recurrent.to(f64),
        rule=GDN_RULE_PATHS.reference.name, conv=CONV_PATHS.reference.name, norm=GATED_NORM_PATHS.reference.name,
    )
    out_state.conv.copy_(conv_state)
    out_state.recurrent.copy_(recurrent)
    return y


def decode_layer_staged(x, w, state, out_state):
    """One block after another, each block's serving choice (as gdn_layer computed a decode step before this table,
    where the dispatch table names no conv or gated norm)."""
    # The rule path writes straight into out_state unless that is the state it reads (not every rule path
    # is written for that); the result is the same bits either way.
    aliased = _same_memory(out_state.recurrent, state.recurrent)
    y, conv_state, recurrent = staged_layer(
        x, w, state.conv, state.recurrent, rule=None, conv=None, norm=None,
        final_state=None if aliased else out_state.recurrent,
    )
    out_state.conv.copy_(conv_state)
    if recurrent is not out_state.recurrent:
        out_state.recurrent.copy_(recurrent)
    return y


def fused_layer(x, w, state, out_state, core):
    """The stacked input GEMM, `core` (the fused kernel's launcher, triton_decode_layer.fused_decode_core's
    signature), then out_proj: three launches. Tests hand it deliberately broken kernels."""
    batch = x.shape[0]
    proj = F.linear(x.reshape(batch, -1), w.in_proj_stacked)
    return F.linear(core(proj, w, state, out_state), w.out_proj).view(batch, 1, -1)


def decode_layer_triton(x, w, state, out_state):
    if triton_decode_layer is None:
        raise RuntimeError("the 'triton' GDN decode layer needs Triton, which is not installed; use 'staged'")
    return fused_layer(x, w, state, out_state, triton_decode_layer.fused_decode_core)


def triton_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    return triton_support.unavailable_reason(
        device, None if triton_decode_layer is None else triton_decode_layer.INTERPRETED
    )


# Tests iterate this table: a path is tested the moment it is registered (tolerances: model.tolerances).
GDN_DECODE_LAYER_PATHS = PathTable("GDN decode layer path", [
    ComputePath("reference", decode_layer_reference, "every block's reference path, float64", max_tokens=1,
                is_reference=True, output_dtype_rule=always_float64, state_dtype_rule=always_float64),
    ComputePath("staged", decode_layer_staged, "the per-block paths one after another (~20 launches)", max_tokens=1),
    ComputePath("triton", decode_layer_triton, "stacked input GEMM, one Triton kernel, out_proj (3 launches)",
                max_tokens=1, dtypes=LOW_PRECISION, why_unavailable=triton_unavailable_reason),
])


@scoped
def select_decode_layer_path(batch: int, device: torch.device | str, dtype: torch.dtype) -> str:
    """The serving choice: the device's dispatch table entry for `gdn_layer_decode` at this batch where it names
    a path that can run, else `staged` (what gdn_layer ran before this table)."""
    return served_path(GDN_DECODE_LAYER_PATHS, "gdn_layer_decode", batch, 1, device, dtype, "staged")


def _check_shapes(x, w, state, out_state) -> None:
    d = w.dims
    if x.dim() != 3 or x.shape[1] != 1 or x.shape[2] != d.hidden_size:
        raise ValueError(f"the GDN decode layer takes one token: x has shape {tuple(x.shape)}, expected [B, 1, {d.hidden_size}]")
    batch = x.shape[0]
    conv_shape = (batch, d.conv_dim, d.conv_kernel - 1)
    recurrent_shape = (batch, d.num_v_heads, d.head_k_dim, d.head_v_dim)
    for what, s in (("state", state), ("out_state", out_state)):
        if tuple(s.conv.shape) != conv_shape or tuple(s.recurrent.shape) != recurrent_shape:
            raise ValueError(f"{what} has conv {tuple(s.conv.shape)} and recurrent {tuple(s.recurrent.shape)}; "
                             f"expected {conv_shape} and {recurrent_shape}")


def run_decode_layer(name: str, x: torch.Tensor, w, state, out_state) -> torch.Tensor:
    """Run a registered path by name, after checking shapes and that it can run this input."""
    _check_shapes(x, w, state, out_state)
    return GDN_DECODE_LAYER_PATHS.checked(name, 1, x.dtype, x.device).fn(x, w, state, out_state)
