"""The MoE block replayed from a per-bucket CUDA graph (model.moe.GraphedMoEBlock) on a CUDA GPU, at the real
per-rank dims: every call returns the bits the eager block gives on the bucket-sized input the graph saw (the
caller's T rows, then whatever rows an earlier call left), for each block path it captures; calls in one bucket
share one graph; and what a call costs an eager caller, beside the eager block.

    python3 -m pytest -m gpu -s tests/numerics/test_moe_graphed_block_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from harness.tune.measure.dims import REAL_PER_RANK
from harness.tune.measure.inputs import moe_weights
from model.moe import GraphedMoEBlock, moe_block
from tests.numerics.gpu_timing import eager_wall_us

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
BF16 = torch.bfloat16


def _x(tokens: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    return torch.randn(tokens, REAL_PER_RANK.moe.hidden, generator=gen, device=CUDA).to(BF16)


@pytest.fixture(scope="module")
def weights():
    return moe_weights(REAL_PER_RANK.moe, BF16, CUDA)


@pytest.mark.parametrize("block", ["triton_fused_block", "composed"])
def test_graphed_block_returns_the_eager_blocks_bits_on_the_bucket_it_replays(weights, block):
    graphed = GraphedMoEBlock(weights, block=block)
    # In call order: a bucket's first call, smaller calls in the same bucket (stale rows behind them), new buckets.
    sequence = [8, 3, 5, 1, 2, 64, 33, 64]
    seen: dict[int, torch.Tensor] = {}  # per bucket: the rows its input holds
    for i, tokens in enumerate(sequence):
        x = _x(tokens, seed=i)
        bucket = graphed.bucket(tokens)
        rows = seen.get(bucket, torch.zeros(bucket, x.shape[1], dtype=BF16, device=CUDA)).clone()
        rows[:tokens] = x
        seen[bucket] = rows
        got = graphed(x)
        expected = moe_block(rows, weights, block=block)[:tokens]
        assert got.shape == x.shape and torch.equal(got, expected), f"T={tokens} (bucket {bucket})"
    assert sorted(k[0] for k in graphed._graphs) == [1, 2, 4, 8, 64]  # one graph per bucket used


def test_graphed_block_cost_to_an_eager_caller(weights):
    """Not a gate (eager host time varies about 2x between lent VMs): the graphed block beside the eager one."""
    for tokens in (1, 8):
        x = _x(tokens, seed=100 + tokens)
        graphed = GraphedMoEBlock(weights)
        graphed(x)  # captures
        eager = min(eager_wall_us(lambda: moe_block(x, weights, block="triton_fused_block")) for _ in range(3))
        replay = min(eager_wall_us(lambda: graphed(x)) for _ in range(3))
        print(f"T={tokens}: eager fused block {eager:.1f} us per call, graphed {replay:.1f} us (best of 3 x 200 calls)")
        assert replay < eager, "a graph replay that costs more than the eager block has no reason to exist"
