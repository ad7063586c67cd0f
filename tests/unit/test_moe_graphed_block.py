"""GraphedMoEBlock's bookkeeping on the CPU: its buckets and the errors it gives. What it computes is checked on
CUDA (tests/numerics/test_moe_graphed_block_gpu.py)."""
from __future__ import annotations

import pytest
import torch

from harness.tune.measure.dims import TINY
from harness.tune.measure.inputs import moe_weights
from model.moe import GraphedMoEBlock
from model.moe.graphed_block import BUCKETS


@pytest.fixture
def graphed():
    return GraphedMoEBlock(moe_weights(TINY.moe, torch.float32, torch.device("cpu")))


def test_a_token_count_gets_the_smallest_bucket_that_holds_it(graphed):
    assert BUCKETS == (1, 2, 4, 8, 16, 32, 64)
    assert [graphed.bucket(t) for t in (1, 2, 3, 4, 5, 9, 17, 33, 64)] == [1, 2, 4, 4, 8, 16, 32, 64, 64]
    with pytest.raises(ValueError, match="up to 64; call moe_block eagerly"):
        graphed.bucket(65)


def test_cpu_input_is_refused_with_the_fix(graphed):
    with pytest.raises(ValueError, match="replays CUDA graphs.*call moe_block"):
        graphed(torch.zeros(2, TINY.moe.hidden))


def test_an_unknown_block_path_is_refused_at_construction():
    with pytest.raises(KeyError, match="registered"):
        GraphedMoEBlock(moe_weights(TINY.moe, torch.float32, torch.device("cpu")), block="no_such_block")
