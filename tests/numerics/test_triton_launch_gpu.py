"""Prepared launches (model/dispatch/triton_launch.py) on a CUDA GPU: a kernel launched straight into its compiled form
computes the same bits as through the JIT, for the fused MoE block and the fused GDN decode layer, whatever
changes between calls (another x, a misaligned or strided x, other weights, other dims), and it is really the
prepared route that ran. Also prints the eager wall time per call of each block, JIT against prepared.

    python3 -m pytest -m gpu -s tests/numerics/test_triton_launch_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from harness.tune.measure.dims import REAL_PER_RANK, MoEDims
from harness.tune.measure.inputs import gdn_weights, moe_weights
from model.dispatch import triton_launch
from model.gdn import GDNState, run_decode_layer
from model.moe import moe_block
from tests.numerics.gpu_timing import eager_wall_us, through_the_jit

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
SMALL_MOE = MoEDims(hidden=72, experts=12, top_k=3, intermediate=24, shared_intermediate=40)


def _x(tokens: int, hidden: int, seed: int, offset: int = 0) -> torch.Tensor:
    """[tokens, hidden] bf16, starting `offset` elements into its buffer (offset 1: not 16-byte aligned)."""
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    flat = torch.randn(tokens * hidden + offset, generator=gen, device=CUDA).to(BF16)
    return flat[offset:].view(tokens, hidden)


@pytest.mark.parametrize("tokens", [1, 3, 8, 64])
def test_fused_moe_block_prepared_equals_jit(tokens):
    w = moe_weights(REAL_PER_RANK.moe, BF16, CUDA)
    small = moe_weights(SMALL_MOE, BF16, CUDA, seed=5)
    cases = [
        ("aligned", w, _x(tokens, 2048, seed=tokens)),
        ("misaligned", w, _x(tokens, 2048, seed=tokens + 1, offset=1)),
        ("strided", w, _x(tokens, 4096, seed=tokens + 2)[:, ::2]),  # copied by the block, every call
        ("other dims", small, _x(tokens, SMALL_MOE.hidden, seed=tokens + 3)),
    ]
    for name, weights, x in cases:
        expected = through_the_jit(lambda: moe_block(x, weights, block="triton_fused_block"))
        before = triton_launch.direct_launches()
        for _ in range(3):  # the first call of a new shape may take the JIT; the later ones must not
            got = moe_block(x, weights, block="triton_fused_block")
            assert torch.equal(got, expected), f"{name}: prepared launch differs from the JIT's"
        assert triton_launch.direct_launches() - before >= 6, f"{name}: the prepared route did not run"


def _gdn_state(batch: int, seed: int):
    d = REAL_PER_RANK.gdn
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    return GDNState(conv=torch.randn(batch, d.conv_dim, d.conv_kernel - 1, generator=gen, device=CUDA).to(BF16),
                    recurrent=torch.randn(batch, d.num_v_heads, d.head_k_dim, d.head_v_dim, generator=gen, device=CUDA))


@pytest.mark.parametrize("batch", [1, 8, 256])
def test_fused_gdn_decode_layer_prepared_equals_jit(batch):
    w = gdn_weights(REAL_PER_RANK.gdn, BF16, CUDA)
    state = _gdn_state(batch, seed=batch)
    x = _x(batch, 2048, seed=batch)[:, None]
    out = GDNState(conv=torch.empty_like(state.conv), recurrent=torch.empty_like(state.recurrent))
    expected_y = through_the_jit(lambda: run_decode_layer("triton", x, w, state, out))
    expected = (expected_y, out.conv.clone(), out.recurrent.clone())
    before = triton_launch.direct_launches()
    for _ in range(3):
        y = run_decode_layer("triton", x, w, state, out)
        assert torch.equal(y, expected[0]) and torch.equal(out.conv, expected[1])
        assert torch.equal(out.recurrent, expected[2])
    assert triton_launch.direct_launches() - before >= 2, "the prepared route did not run"
    # In place (the state is both read and written): two steps through the prepared route equal two JIT steps.
    a, b = _gdn_state(batch, seed=99), _gdn_state(batch, seed=99)
    for _ in range(2):
        ya = through_the_jit(lambda: run_decode_layer("triton", x, w, a, a))
        yb = run_decode_layer("triton", x, w, b, b)
        assert torch.equal(ya, yb) and torch.equal(a.conv, b.conv) and torch.equal(a.recurrent, b.recurrent)


def test_eager_wall_time_jit_against_prepared():
    """Not a gate (eager time on a lent VM varies about 2x between VMs): the two routes side by side, for the
    record. The prepared route must not be slower by more than noise."""
    w = moe_weights(REAL_PER_RANK.moe, BF16, CUDA)
    gw = gdn_weights(REAL_PER_RANK.gdn, BF16, CUDA)
    x = _x(1, 2048, seed=0)
    state = _gdn_state(1, seed=0)
    out = GDNState(conv=torch.empty_like(state.conv), recurrent=torch.empty_like(state.recurrent))
    blocks = {
        "moe_block triton_fused_block T=1": lambda: moe_block(x, w, block="triton_fused_block"),
        "gdn decode layer triton B=1": lambda: run_decode_layer("triton", x[:, None], gw, state, out),
    }
    for name, fn in blocks.items():
        rounds = [(through_the_jit(lambda: eager_wall_us(fn)), eager_wall_us(fn)) for _ in range(3)]
        jit, prepared = min(r[0] for r in rounds), min(r[1] for r in rounds)
        print(f"{name}: eager wall {jit:.1f} us through the JIT, {prepared:.1f} us prepared "
              f"(best of 3 rounds of 200 calls; rounds {[(round(a), round(b)) for a, b in rounds]})")
        assert prepared <= jit * 1.10, f"{name}: prepared {prepared:.1f} us against the JIT's {jit:.1f} us"
