"""The whole Qwen3.6 / Qwen3-Next text model in pure PyTorch: prefill and decode with per-layer state.

    h = embed(ids)
    per layer:  h = h + mixer(norm1(h))   (GDN for "linear_attention", gated attention for "full_attention")
                h = h + mlp(norm2(h))     (the sparse MoE block through model.moe's dispatcher, or a dense MLP)
    logits = lm_head(final_norm(h))
State per layer: GDNState (conv window + recurrent state) or KVCache; `Qwen36Cache.length` tokens seen.
`forward` also steps a `StaticDecodeCache` (model/qwen36/static_cache.py): the same loop with the mixers that
write their state into preallocated buffers in place and take positions from a device-side length, for a step a
CUDA graph can capture (model/qwen36/static_step.py).
Which registered path each block runs is chosen by `Qwen36Paths`; the default is the serving dispatch.
`forward(..., trace=...)` runs each block inside `trace(kind)` (kinds: TRACE_KINDS), for a profiler that
times blocks without a copy of this loop; without it nothing is wrapped. A model built with `call_blocks` calls the
blocks BLOCK_CALLS names through what it returns for each (`call_blocks(name, fn) -> fn'`, same arguments and
results): a caller's own calling convention around the same blocks (the harness calls them through the plugin's
served ops), in every step this model runs, static and captured ones included.

The residual add and the norm after it are one call of model.norm.rms_norm.ADD_RMS_NORM_PATHS (`h, x = add_norm(h, y)`),
so a path can do both in one kernel; the `fused` path is the two as before, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, ContextManager, Union

import torch
import torch.nn.functional as F

from ..attention.decode_layer import attention_static
from ..attention.layer import ATTENTION_CORES, KVCache, gated_attention
from ..dispatch.scope import one_dispatch_scope
from ..gdn import CONV_PATHS, GDN_RULE_PATHS, GDNState, gdn_layer
from ..moe import MoEConfig, MoEWeights, moe_block
from ..norm.rms_norm import ADD_RMS_NORM_PATHS, RMS_NORM_PATHS, select_add_rms_norm_path
from .static_cache import StaticDecodeCache
from .weights import DenseMLPWeights, Qwen36Weights

__all__ = ["Qwen36Paths", "Qwen36Cache", "Qwen36Model", "TRACE_KINDS", "BLOCK_CALLS"]

# The block kinds `forward` names to its `trace`: the input embedding, every RMSNorm between blocks with the
# residual add before it (two per layer and the final one; q/k norms and the GDN gated norm belong to their
# mixer), the two mixers, the sparse MoE block or a dense MLP, and the lm_head.
TRACE_KINDS = ("embed", "norm", "gdn", "attention", "moe", "mlp", "lm_head")
Trace = Callable[[str], ContextManager]
# The block functions `call_blocks` is asked for, by name: the residual add + RMSNorm between blocks
# (h, y, weight, eps) -> (h + y, normed), the GDN layer (x, weights, state, **paths) -> (y, state), the MLP or MoE
# block (x, weights) -> y, the attention layer (x, weights, cache, **paths) -> (y, cache).
BLOCK_CALLS = ("add_rms_norm", "gdn", "mlp", "attention")
CallBlocks = Callable[[str, Callable], Callable]


@dataclass(frozen=True)
class Qwen36Paths:
    """The path each block runs. None means the serving choice (the device's dispatch table, else the default).

    `moe_block` picks the whole MoE block's path (model.moe.MOE_BLOCK_PATHS; `router` and `moe` serve the
    `composed` block), `gdn_decode_layer` the whole GDN layer's path for a one-token step
    (model.gdn.GDN_DECODE_LAYER_PATHS; `gdn_rule` and `gdn_conv` serve the `staged` layer and prefills). A forced
    `gdn_rule` or `gdn_conv` runs the staged layer, so it cannot combine with `gdn_decode_layer`.
    `attention_decode_layer` picks the full-attention layer's path for a one-token step over a static cache
    (model.attention.decode_layer.ATTENTION_DECODE_LAYER_PATHS); a forced `attention_core` or `norm` runs the staged
    attention (`gated_attention_static`) with them, and a prefill always does.
    `norm` names the path of every RMSNorm (model.norm.rms_norm's tables: the residual add + RMSNorm between blocks, the
    q/k norms, the GDN gated norm alike); None: the serving choice of each (the device's dispatch table, else
    `fused`), so a one-token step still takes the GDN and attention decode-layer paths. A forced `norm` runs the
    staged GDN layer and the staged attention. `add_norm` picks the residual add + RMSNorm between blocks alone
    (model.norm.rms_norm.ADD_RMS_NORM_PATHS), over `norm`, keeping the mixers' choices."""

    moe: MoEConfig = field(default_factory=MoEConfig)
    router: str = "topk_softmax"
    moe_block: str | None = None
    gdn_rule: str | None = None
    gdn_conv: str | None = None
    gdn_decode_layer: str | None = None
    attention_core: str | None = None
    attention_decode_layer: str | None = None
    norm: str | None = None
    add_norm: str | None = None

    def between_blocks_norm(self, rows: int, device: torch.device, dtype: torch.dtype) -> str:
        """The residual add + RMSNorm path between blocks for a call over `rows` tokens: `add_norm`, else `norm`,
        else the serving choice (model.norm.rms_norm.select_add_rms_norm_path)."""
        return self.add_norm or self.norm or select_add_rms_norm_path(rows, device, dtype)

    @classmethod
    def reference(cls) -> "Qwen36Paths":
        """Every block's reference path (float64 inside where the reference is float64)."""
        return cls(
            moe=MoEConfig(native=False),
            router="reference",
            moe_block="composed",  # reference router and experts, composed (never a fused block a table names)
            gdn_rule=GDN_RULE_PATHS.reference.name,
            gdn_conv=CONV_PATHS.reference.name,
            attention_core=ATTENTION_CORES.reference.name,
            norm=RMS_NORM_PATHS.reference.name,
        )


@dataclass(frozen=True)
class Qwen36Cache:
    layers: tuple[Union[GDNState, KVCache, None], ...]
    length: int = 0


class Qwen36Model:
    def __init__(self, weights: Qwen36Weights, paths: Qwen36Paths | None = None,
                 call_blocks: CallBlocks | None = None):
        self.weights = weights
        self.config = weights.config
        self.paths = Qwen36Paths() if paths is None else paths
        self.call_blocks = call_blocks  # module docstring; None: each block called directly

    def new_cache(self) -> Qwen36Cache:
        return Qwen36Cache(layers=(None,) * self.config.num_hidden_layers)

    def _decode_layer(self, tokens: int) -> str | None:
        """The GDN decode-layer path to force (None: the serving choice); only a one-token step takes one."""
        return self.paths.gdn_decode_layer if tokens == 1 else None

    def _mlp(self, h: torch.Tensor, w: Union[MoEWeights, DenseMLPWeights]) -> torch.Tensor:
        flat = h.reshape(-1, h.shape[-1])
        if isinstance(w, MoEWeights):
            out = moe_block(flat, w, self.paths.moe, self.paths.router, block=self.paths.moe_block)
        else:
            out = F.linear(F.silu(F.linear(flat, w.gate_proj)) * F.linear(flat, w.up_proj), w.down_proj)
        return out.reshape(h.shape)

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, cache: Qwen36Cache | StaticDecodeCache | None = None,
        trace: Trace | None = None,
    ) -> tuple[torch.Tensor, Qwen36Cache | StaticDecodeCache]:
        """logits [B, T, vocab] for `input_ids` [B, T] following `cache` (None: a fresh batch of sequences).

        A Qwen36Cache is left as it was and a new one returned. A StaticDecodeCache is updated in place and
        returned (its length advanced on the device); the caller keeps its length below max_len.
        `trace`: called as `trace(kind)` around each block (kind in TRACE_KINDS), returning a context manager;
        None leaves every block unwrapped, so the untraced step costs what it did before the hook."""
        if input_ids.dim() != 2 or input_ids.shape[1] < 1:
            raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}; expected [batch, tokens >= 1]")
        with one_dispatch_scope():  # every layer asks the dispatchers the same questions: answer each once
            return self._forward(input_ids, self.new_cache() if cache is None else cache, trace)

    def _forward(
        self, input_ids: torch.Tensor, cache: Qwen36Cache | StaticDecodeCache, trace: Trace | None,
    ) -> tuple[torch.Tensor, Qwen36Cache | StaticDecodeCache]:
        static = isinstance(cache, StaticDecodeCache)
        tokens = input_ids.shape[1]
        norm = self.paths.between_blocks_norm(input_ids.numel(), input_ids.device, self.weights.embed.dtype)
        rms, add_norm = RMS_NORM_PATHS[norm].fn, ADD_RMS_NORM_PATHS[norm].fn
        # The mixers by cache: the static ones keep their state in the cache's buffers (same loop, same blocks).
        if static:
            gdn = partial(gdn_layer, in_place=True)
            attention = partial(attention_static, decode_layer=self.paths.attention_decode_layer if tokens == 1 else None)
        else:
            gdn, attention = gdn_layer, _dynamic_attention
        embed, mlp, lm_head = F.embedding, self._mlp, F.linear
        if self.call_blocks is not None:
            call = self.call_blocks
            add_norm, gdn, mlp, attention = (call("add_rms_norm", add_norm), call("gdn", gdn), call("mlp", mlp),
                                             call("attention", attention))
        if trace is not None:  # each block inside trace(kind); without a trace nothing is wrapped
            rms, add_norm = _traced(trace, "norm", rms), _traced(trace, "norm", add_norm)
            embed, lm_head = _traced(trace, "embed", embed), _traced(trace, "lm_head", lm_head)
            gdn, attention = _traced(trace, "gdn", gdn), _traced(trace, "attention", attention)
            mlp = _traced(trace, _mlp_kind, mlp)
        eps = self.config.rms_norm_eps
        layers = self.weights.layers
        h = embed(input_ids, self.weights.embed)
        x = rms(h, layers[0].input_norm, eps)
        new_states = []
        for i, (layer, state) in enumerate(zip(layers, cache.layers)):
            if layer.kind == "linear_attention":
                y, state = gdn(x, layer.mixer, state, rule=self.paths.gdn_rule, conv=self.paths.gdn_conv,
                               norm=self.paths.norm, decode_layer=self._decode_layer(tokens))
            else:
                y, state = attention(x, layer.mixer, state, core=self.paths.attention_core, norm=self.paths.norm)
            new_states.append(state)
            h, x = add_norm(h, y, layer.post_norm, eps)
            next_norm = layers[i + 1].input_norm if i + 1 < len(layers) else self.weights.final_norm
            h, x = add_norm(h, mlp(x, layer.mlp), next_norm, eps)
        logits = lm_head(x, self.weights.lm_head)
        if static:
            return logits, cache.advance(input_ids.shape[1])
        return logits, Qwen36Cache(layers=tuple(new_states), length=cache.length + input_ids.shape[1])

    __call__ = forward

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, prefill_chunk: int | None = None) -> torch.Tensor:
        """Greedy tokens [B, max_new_tokens]: prefill (in chunks of `prefill_chunk` if given), then decode steps."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: ask for at least one token")
        cache = self.new_cache()
        step = prefill_chunk or input_ids.shape[1]
        for start in range(0, input_ids.shape[1], step):
            logits, cache = self.forward(input_ids[:, start : start + step], cache)
        tokens = [logits[:, -1].argmax(-1)]
        for _ in range(max_new_tokens - 1):
            logits, cache = self.forward(tokens[-1][:, None], cache)
            tokens.append(logits[:, -1].argmax(-1))
        return torch.stack(tokens, dim=1)


def _dynamic_attention(x, w, cache, *, core: str | None, norm: str | None):
    """gated_attention with the defaults for what is not forced (sdpa, the fused q/k norms)."""
    return gated_attention(x, w, cache, core=core or "sdpa", norm=norm or "fused")


def _mlp_kind(h: torch.Tensor, w: Union[MoEWeights, DenseMLPWeights]) -> str:
    return "moe" if isinstance(w, MoEWeights) else "mlp"


def _traced(trace: Trace, kind: Union[str, Callable[..., str]], fn: Callable) -> Callable:
    """`fn` run inside `trace(kind)`; `kind` may be a function of fn's positional arguments."""

    def block(*args, **kwargs):
        with trace(kind if isinstance(kind, str) else kind(*args)):
            return fn(*args, **kwargs)

    return block
