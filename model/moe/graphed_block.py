"""The MoE block replayed from a CUDA graph per token-count bucket, for an eager caller.

A platform that cannot capture its whole decode step (the BI-V100's TP=4 capture stalls in NCCL) can still
capture one block with no collective inside it. `GraphedMoEBlock` captures `moe_block(x, w, block=...)` once per
bucket of token counts (1, 2, 4, ... 64), on a static input of the bucket's size. A call of T tokens pays:
- one copy of x into the bucket's input;
- the replay;
- one copy of the first T output rows.

Rows T..bucket-1 of the input keep whatever an earlier call left there. That is harmless: the block treats
tokens independently, and their outputs are not returned. This is not a dispatch-table path: it is a graph
replay, so a whole-step capture cannot contain it, and it does not count toward eager time. `qwen36 tune` reports
what it costs an eager caller (block `moe_block_graphed`).
"""
from __future__ import annotations

import torch

from .block import MoEWeights
from .block_paths import FUSED_BLOCK_MAX_TOKENS, MOE_BLOCK_PATHS, moe_block

__all__ = ["BUCKETS", "GraphedMoEBlock"]

BUCKETS = tuple(2**p for p in range(FUSED_BLOCK_MAX_TOKENS.bit_length()))  # 1, 2, 4, ... 64


class GraphedMoEBlock:
    """`moe_block(x, w, block=block)` for x [T, H] on CUDA, T up to the largest bucket, replayed from a graph
    captured on the first call in T's bucket. The weights are read where they are at capture time: update them
    in place, never by rebinding."""

    def __init__(self, w: MoEWeights, block: str = "triton_fused_block", buckets: tuple[int, ...] = BUCKETS):
        MOE_BLOCK_PATHS[block]  # an unknown name fails here, naming the registered ones
        self.w, self.block, self.buckets = w, block, tuple(sorted(buckets))
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._pool = None  # one memory pool for every bucket's graph

    def bucket(self, tokens: int) -> int:
        for b in self.buckets:
            if tokens <= b:
                return b
        raise ValueError(f"{tokens} tokens: the graphed MoE block captures up to {self.buckets[-1]}; "
                         "call moe_block eagerly for more")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cuda":
            raise ValueError(f"the graphed MoE block replays CUDA graphs; x is on {x.device}: call moe_block")
        tokens = x.shape[0]
        key = (self.bucket(tokens), x.dtype, x.device)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(*key, hidden=x.shape[1])
        graph, static_in, static_out = entry
        static_in[:tokens].copy_(x)
        graph.replay()
        return static_out[:tokens].clone()

    def _capture(self, bucket: int, dtype: torch.dtype, device: torch.device, hidden: int):
        static_in = torch.zeros(bucket, hidden, dtype=dtype, device=device)
        # Warm up on a side stream first: Triton compiles, cuBLAS picks its kernels, and allocations settle
        # outside the capture (torch.cuda.graph's own advice).
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                moe_block(static_in, self.w, block=self.block)
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static_out = moe_block(static_in, self.w, block=self.block)
        return graph, static_in, static_out
