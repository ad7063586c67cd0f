"""The decode state of a fixed batch in preallocated buffers, updated in place: what a captured CUDA graph needs.

A `Qwen36Cache` is rebuilt by every step (new GDN states, a KV cache grown by torch.cat, a host-side length). A
`StaticDecodeCache` holds, per layer, a GDNState the GDN layer updates in place (`in_place=True`), or a
model.attention.layer.StaticKVCache of `max_len` positions, and the number of tokens seen as an int64 tensor on the
device, shared by the attention layers and advanced in place after each step. Nothing in a step then reads a
host integer or allocates a shape that depends on the length, so one captured step serves every length below
max_len. It is filled from a prefill's dynamic cache (`from_prefill`): the prompt runs the ordinary forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from ..attention.layer import KVCache, StaticKVCache
from ..gdn import GDNState

__all__ = ["StaticDecodeCache"]


@dataclass(frozen=True)
class StaticDecodeCache:
    """Per layer a GDNState (buffers updated in place) or a StaticKVCache; `length`: int64, 0-dim, on the device,
    the tokens each sequence has seen (the attention layers hold the same tensor).

    Capacity is not checked inside a step (that would read the device length on the host): a step at length
    max_len writes out of bounds (an IndexError on a CPU, a device-side assert on CUDA). The caller counts its
    steps on the host; model.qwen36.static_step.CapturableDecodeStep does."""

    layers: tuple[Union[GDNState, StaticKVCache], ...]
    length: torch.Tensor
    max_len: int  # positions each attention layer's buffers hold

    @classmethod
    def from_prefill(cls, cache, max_len: int) -> "StaticDecodeCache":
        """Buffers for `cache`'s batch holding `max_len` positions, filled with a prefill's dynamic cache
        (a model.qwen36.Qwen36Cache whose every layer has run)."""
        if any(layer is None for layer in cache.layers):
            raise ValueError("the cache has layers that have not run: prefill at least one token first")
        if max_len <= cache.length:
            raise ValueError(f"max_len={max_len} leaves no room for a decode step after {cache.length} tokens")
        device = cache.layers[0].k.device if isinstance(cache.layers[0], KVCache) else cache.layers[0].conv.device
        length = torch.tensor(cache.length, dtype=torch.int64, device=device)
        layers = tuple(
            StaticKVCache.holding(layer, max_len, length) if isinstance(layer, KVCache)
            else GDNState(conv=layer.conv.clone(), recurrent=layer.recurrent.clone())
            for layer in cache.layers
        )
        return cls(layers, length, max_len)

    def load(self, cache) -> None:
        """Overwrite the buffers with a prefill's dynamic cache of the same batch (the addresses stay)."""
        if len(cache.layers) != len(self.layers):
            raise ValueError(f"a cache of {len(cache.layers)} layers for buffers of {len(self.layers)}")
        for mine, theirs in zip(self.layers, cache.layers):
            if isinstance(mine, StaticKVCache):
                mine.load(theirs)
            else:
                mine.conv.copy_(theirs.conv)
                mine.recurrent.copy_(theirs.recurrent)
        self.length.fill_(cache.length)

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer, the length included (each once: the KV layers share `length`)."""
        out = [self.length]
        for layer in self.layers:
            out += [layer.k, layer.v] if isinstance(layer, StaticKVCache) else [layer.conv, layer.recurrent]
        return out

    def snapshot(self) -> list[torch.Tensor]:
        """Copies of every buffer, for `restore` (e.g. after warm-up steps that advanced the cache)."""
        return [t.clone() for t in self.tensors()]

    def restore(self, snapshot: list[torch.Tensor]) -> None:
        for buffer, saved in zip(self.tensors(), snapshot, strict=True):
            buffer.copy_(saved)

    def advance(self, tokens: int) -> "StaticDecodeCache":
        """After a step of `tokens` tokens: the device length moves on, in place (the same tensor every step)."""
        self.length.add_(tokens)
        return self
