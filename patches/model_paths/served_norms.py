"""The norms of Qwen3-Next / Qwen3.5 served by the model's paths, through vLLM's out-of-tree registry.

Seams (vLLM 0.32, vllm/model_executor/layers/layernorm.py, both `CustomOp`s):
- `GemmaRMSNorm` (`gemma_rms_norm`: the input, post-attention and final norms, q/k norms). Called with the
  residual (`hidden_states, residual = self.input_layernorm(hidden_states, residual)`), it is the residual add +
  RMSNorm: block `add_rms_norm`, paths model.norm.rms_norm.ADD_RMS_NORM_PATHS (`triton`: one launch). Called
  without it (the first layer's input norm, q/k norms) it stays vLLM's: no table block chooses that norm.
- `RMSNormGated` (`rms_norm_gated`: the GDN layer's output norm, `w * rms_norm(x) * silu(z)`): block
  `gdn_gated_norm`, paths model.norm.rms_norm.GATED_NORM_PATHS. Only the shape the model computes is
  substituted: a gate, gating after the norm, SiLU, one group, no bias; any other stays vLLM's.
Which path serves each call: patches/model_paths/served_choice.py (the device's table, else vLLM's own).

vLLM's contract, kept: `forward(x, residual)` returns `(normed, x + residual)` in x's dtype; `forward(x, z)` of
the gated norm returns x's dtype. The substitute classes subclass vLLM's, so their weights, loading and
`extra_repr` are vLLM's; vLLM's own forward is what they call wherever the model's path does not serve.
"""
from __future__ import annotations

import functools

import torch

from model.gdn import select_gated_norm_path
from model.norm.rms_norm import ADD_RMS_NORM_PATHS, GATED_NORM_PATHS, select_add_rms_norm_path

from ..core import oot
from ..core.registry import Patch
from . import served_ops
from .served_choice import BlockServing, configure, serving_device, table_rows_detail

__all__ = ["PATCH", "SWITCH", "BLOCKS", "ADD_NORM", "GATED_NORM", "add_norm_by_table", "gated_norm_by_table",
           "served_classes", "uninstall"]

SWITCH = "QWEN36_PATCH_SERVED_NORMS"
SEAM_MODULE = "vllm.model_executor.layers.layernorm"
SEAM_CLASSES = ("GemmaRMSNorm", "RMSNormGated")

BLOCKS = ("add_rms_norm", "gdn_gated_norm")  # the dispatch-table blocks this patch serves

ADD_NORM = BlockServing("add_rms_norm", ADD_RMS_NORM_PATHS, select_add_rms_norm_path)
GATED_NORM = BlockServing("gdn_gated_norm", GATED_NORM_PATHS, select_gated_norm_path)


def _adds_residual(x: torch.Tensor, residual: torch.Tensor | None) -> bool:
    return residual is not None and residual.dtype == x.dtype and residual.shape == x.shape


def _who(serving, weight: torch.Tensor) -> str:
    return served_ops.who_serves(serving, serving_device() if weight.device.type != "cpu" else weight.device)


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.dim() else 0


def add_norm_by_table(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(normed, x + residual) by the model path the table (or forcing) chooses for this call, or None where vLLM's
    own serves it. What the substitute runs eagerly and inside its op; no vLLM needed (the GPU tests call it)."""
    if not (_adds_residual(x, residual) and ADD_NORM.may_serve(x.device, x.dtype)):
        return None
    rows = _rows(x)
    name = ADD_NORM.path(rows, rows, x.device, x.dtype)
    if name is None:
        return None
    h_new, normed = ADD_RMS_NORM_PATHS[name].fn(residual, x, weight, eps)
    return normed, h_new


def gated_norm_by_table(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """`w * rms_norm(x) * silu(z)` by the model path the table (or forcing) chooses for this call, or None where
    vLLM's own serves it (the caller has checked that the layer computes this)."""
    if not GATED_NORM.may_serve(x.device, x.dtype):
        return None
    rows = _rows(x)
    name = GATED_NORM.path(rows, rows, x.device, x.dtype)
    return None if name is None else GATED_NORM_PATHS[name].fn(x, weight, eps, z)


@functools.cache
def served_classes() -> dict[str, tuple[type, type]]:
    """in-tree class name -> (vLLM's class, ours); built once, so a second install registers the same classes."""
    import importlib

    layernorm = importlib.import_module(SEAM_MODULE)
    GemmaRMSNorm, RMSNormGated = layernorm.GemmaRMSNorm, layernorm.RMSNormGated

    class ServedGemmaRMSNorm(GemmaRMSNorm):
        """vLLM's GemmaRMSNorm; with a residual, the residual add + RMSNorm by the table's model path."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            served_ops.name_layer(self, ADD_NORM.block)
            served_ops.log_mode_once(ADD_NORM.block, lambda: _who(ADD_NORM, self.weight))

        def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
            if not torch.compiler.is_compiling():
                return self._qwen36_eager(x, residual)
            # Traced (a compiled server): one opaque op that chooses per call at run time (served_ops).
            if _adds_residual(x, residual) and served_ops.serves_here(ADD_NORM, x.device, x.dtype):
                return served_ops.served_add_rms_norm(x, residual, self._qwen36_op_name)
            return super().forward(x, residual)

        def _qwen36_eager(self, x: torch.Tensor, residual: torch.Tensor | None):
            served = add_norm_by_table(x, residual, self.weight, self.variance_epsilon)
            return served if served is not None else super().forward(x, residual)

    class ServedRMSNormGated(RMSNormGated):
        """vLLM's RMSNormGated; the model's gated norm (`w * rms_norm(x) * silu(z)`) by the table's model path."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            served_ops.name_layer(self, GATED_NORM.block)
            served_ops.log_mode_once(GATED_NORM.block, lambda: _who(GATED_NORM, self.weight))

        def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
            if not torch.compiler.is_compiling():
                return self._qwen36_eager(x, z)
            if (z is not None and self._model_computes_this(x, z)
                    and served_ops.serves_here(GATED_NORM, x.device, x.dtype)):
                return served_ops.served_gated_norm(x, z, self._qwen36_op_name)
            return super().forward(x, z)

        def _qwen36_eager(self, x: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
            served = gated_norm_by_table(x, z, self.weight, self.eps) if (
                z is not None and self._model_computes_this(x, z)) else None
            return served if served is not None else super().forward(x, z)

        def _model_computes_this(self, x: torch.Tensor, z: torch.Tensor) -> bool:
            return (self.norm_before_gate and self.activation in ("silu", "swish") and self.bias is None
                    and self.group_size in (None, x.shape[-1]) and z.shape == x.shape
                    and self.weight.shape == (x.shape[-1],))

    return {"GemmaRMSNorm": (GemmaRMSNorm, ServedGemmaRMSNorm), "RMSNormGated": (RMSNormGated, ServedRMSNormGated)}


def probe() -> str | None:
    for name in SEAM_CLASSES:
        reason = oot.registry_reason(SEAM_MODULE, name)
        if reason is not None:
            return reason
    return None


def install(settings) -> str:
    configure(settings.served_force)
    for in_tree, ours in served_classes().values():
        oot.register(in_tree, ours)
    device = serving_device()
    return (f"registry: GemmaRMSNorm with a residual (add_rms_norm: {table_rows_detail('add_rms_norm', device)}), "
            f"RMSNormGated (gdn_gated_norm: {table_rows_detail('gdn_gated_norm', device)}) on {device}"
            + ("; forced: the model's path where the table leaves vLLM's" if settings.served_force else "")
            + f"; {served_ops.routes(ADD_NORM.block, GATED_NORM.block)}")


def uninstall() -> None:
    for in_tree, ours in served_classes().values():
        oot.unregister(in_tree, ours)


PATCH = Patch(
    name="served_norms",
    seam=f"{SEAM_MODULE}: GemmaRMSNorm, RMSNormGated (out-of-tree registry)",
    required=False,  # without it vLLM's norms serve: right, and as fast as vLLM makes them
    switch=SWITCH,
    kind="compute",
    probe=probe,
    install=install,
    uninstall=uninstall,
)
