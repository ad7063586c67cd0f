"""The decode step with its served blocks called through the plugin's opaque ops, as a compiled vLLM calls them.

A compiled vLLM server calls each served block as one op (`qwen36::served_add_rms_norm`, `qwen36::served_gdn_layer`,
`qwen36::served_moe_block`; patches/model_paths/served_ops.py): the dispatcher, torch.library's wrapper, a lookup of the
layer by name, then the block. vLLM's layers are not built here (the GPU machines have no CUDA build of vLLM), so
each op's layer is a stand-in that calls the model's own block function with the arguments the step passes: the op
boundary is the served one, the block inside is the one the direct step calls, so the through-ops step must give the
direct step's logits bit for bit, and its time less the direct step's is what the ops cost.

`through_served_ops()` gives the model's `call_blocks` (model/qwen36/model.py): the residual add + RMSNorm, the GDN
layer and the MoE block through their ops; attention has no served op (vLLM's own serves it) and is called directly.
Under a CUDA graph the ops' Python runs once, at capture: a replay through them is the direct replay's kernels.
"""
from __future__ import annotations

from typing import Callable

import torch

from patches.model_paths import served_ops

__all__ = ["through_served_ops"]


class _StandIn:
    """The layer an op finds by name: the block's function and the arguments of the call in flight (set just before
    the op is called, read inside it; one call at a time, as a step makes them)."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.args: tuple = ()
        self.kwargs: dict = {}
        self.extra = None  # what the block returns beside the op's output (the GDN layer's state)


class _AddRmsNorm(_StandIn):
    def _qwen36_eager(self, x: torch.Tensor, residual: torch.Tensor):
        h_new, normed = self.fn(residual, x, *self.args)  # the model's order: (h + y, normed)
        return normed, h_new


class _GDNLayer(_StandIn):
    def _qwen36_eager(self, x: torch.Tensor) -> torch.Tensor:
        y, self.extra = self.fn(x, *self.args, **self.kwargs)
        return y


class _MoEBlock(_StandIn):
    def _qwen36_eager(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        return self.fn(hidden_states, *self.args)


def _add_rms_norm(fn: Callable) -> Callable:
    layer = _AddRmsNorm(fn)
    name = served_ops.name_layer(layer, "add_rms_norm")

    def call(h, y, weight, eps):
        layer.args = (weight, eps)
        normed, h_new = served_ops.served_add_rms_norm(y, h, name)
        return h_new, normed

    call.stand_in = layer
    return call


def _gdn(fn: Callable) -> Callable:
    layer = _GDNLayer(fn)
    name = served_ops.name_layer(layer, "gdn_layer_decode")

    def call(x, weights, state, **paths):
        layer.args, layer.kwargs = (weights, state), paths
        y = served_ops.served_gdn_layer(x, name)
        state, layer.extra = layer.extra, None
        return y, state

    call.stand_in = layer
    return call


def _moe(fn: Callable) -> Callable:
    layer = _MoEBlock(fn)
    name = served_ops.name_layer(layer, "moe_block")

    def call(x, weights):
        layer.args = (weights,)
        return served_ops.served_moe_block(x, x, name)  # router_logits: the hidden states, as vLLM's block passes

    call.stand_in = layer
    return call


_WRAPPERS = {"add_rms_norm": _add_rms_norm, "gdn": _gdn, "mlp": _moe}


def through_served_ops() -> Callable[[str, Callable], Callable]:
    """The model's `call_blocks`: each served block through its op, the rest as they are. One stand-in per block,
    made at the first ask; the model asks at every forward (its mixers are partials made per forward), and each ask
    hands the stand-in that forward's function."""
    made: dict[str, Callable] = {}

    def call_blocks(name: str, fn: Callable) -> Callable:
        wrap = _WRAPPERS.get(name)
        if wrap is None:
            return fn
        if name not in made:
            made[name] = wrap(fn)
        made[name].stand_in.fn = fn
        return made[name]

    return call_blocks
