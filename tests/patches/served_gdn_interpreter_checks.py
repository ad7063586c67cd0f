"""The served GDN layer's two decode paths agree: the fused Triton core (`triton`, what a GPU with a table row
serves) against the model's staged blocks (`staged`, what the CPU server runs), both through the served layer's own
adapter methods (`_core_triton`, `_core_staged`) on one vLLM-shaped layer and one gathered state. Run under Triton's
interpreter by test_served_gdn_triton_interpreter.py (the kernel is defined with the interpreter chosen at import).

What the triton adapter adds to the kernel the numerics suite proves: the row [q | k | v | z | b | a] it stacks
from vLLM's split projections, the per-rank dims it reads off vLLM's layer (heads / TP), and the conv weight it takes
from vLLM's [dim, 1, W] parameter. A wrong order, a wrong head count or a transposed weight changes the output or the
state far beyond the bound: twice the decode layer's float32 bounds (model.tolerances), both paths being within
those of the float64 reference.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from model.tolerances import GDN_DECODE_LAYER, GDN_DECODE_LAYER_STATE
from patches.model_paths import served_gdn
from tests.numerics.compare import relative_error

F32 = torch.float32


def served_layer(heads: int, v_heads: int, k_dim: int, v_dim: int, width: int, tp: int, seed: int):
    """A ServedQwenGatedDeltaNet holding only what the adapter's core methods read (vLLM's names and shapes)."""
    _, cls = served_gdn.served_class()
    layer = cls.__new__(cls)
    torch.nn.Module.__init__(layer)
    g = torch.Generator().manual_seed(seed)
    local_k, local_v = heads // tp, v_heads // tp
    conv_dim = 2 * local_k * k_dim + local_v * v_dim
    layer.tp_size, layer.hidden_size, layer.conv_kernel_size = tp, 32, width
    layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim = heads, v_heads, k_dim, v_dim
    layer.conv1d = SimpleNamespace(weight=torch.randn(conv_dim, 1, width, generator=g) * 0.5, bias=None)
    layer.A_log = torch.rand(local_v, generator=g) * 2 - 1
    layer.dt_bias = torch.randn(local_v, generator=g) * 0.5
    layer.norm = SimpleNamespace(weight=torch.rand(v_dim, generator=g) + 0.5, eps=1e-6, activation="silu")
    return layer, conv_dim, local_k, local_v, g


SLOTS = 6  # the caches' rows; the step's requests hold some of them, in no particular order


def step_inputs(conv_dim: int, local_v: int, k_dim: int, v_dim: int, width: int, batch: int, g):
    mixed_qkv = torch.randn(batch, conv_dim, generator=g)
    z = torch.randn(batch, local_v, v_dim, generator=g)
    b, a = torch.randn(batch, local_v, generator=g), torch.randn(batch, local_v, generator=g)
    conv_cache = torch.randn(SLOTS, conv_dim, width - 1, generator=g)
    recurrent_cache = torch.randn(SLOTS, local_v, k_dim, v_dim, generator=g) * 0.3
    rows = torch.randperm(SLOTS, generator=g)[:batch].to(torch.int32)
    return (mixed_qkv, z, b, a), conv_cache, recurrent_cache, rows


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(("heads", "v_heads", "tp"), [(2, 4, 1), (4, 8, 2)])
def test_the_triton_core_equals_the_staged_core_through_the_adapter(batch, heads, v_heads, tp):
    k_dim, v_dim, width = 16, 8, 4
    layer, conv_dim, _, local_v, g = served_layer(heads, v_heads, k_dim, v_dim, width, tp, seed=batch + heads)
    step, conv_cache, recurrent_cache, rows = step_inputs(conv_dim, local_v, k_dim, v_dim, width, batch, g)

    staged_conv, staged_rec = conv_cache.clone(), recurrent_cache.clone()
    staged = layer._core_staged(*step, staged_conv, staged_rec, rows)
    triton_conv, triton_rec = conv_cache.clone(), recurrent_cache.clone()
    fused = layer._core_triton(*step, triton_conv, triton_rec, rows)

    assert fused.shape == staged.shape == (batch, local_v * v_dim)
    bound = 2 * GDN_DECODE_LAYER["triton"][F32]
    state_bound = 2 * GDN_DECODE_LAYER_STATE["triton"][F32]
    assert relative_error(fused, staged) <= bound
    assert relative_error(triton_rec, staged_rec) <= state_bound
    assert relative_error(triton_conv, staged_conv) <= state_bound
    others = [r for r in range(SLOTS) if r not in rows.tolist()]
    for cache, before in ((triton_conv, conv_cache), (triton_rec, recurrent_cache), (staged_conv, conv_cache),
                          (staged_rec, recurrent_cache)):
        assert torch.equal(cache[others], before[others])  # other requests' slots untouched
        assert not torch.equal(cache[rows.long()], before[rows.long()])  # the step's slots advanced


def test_a_stacking_mistake_is_far_outside_the_bound(monkeypatch):
    """The check itself: the row stacked as [q | k | v | b | a | z] instead of [q | k | v | z | b | a] fails it."""
    layer, conv_dim, _, local_v, g = served_layer(2, 4, 16, 8, 4, 1, seed=0)
    step, conv_cache, recurrent_cache, rows = step_inputs(conv_dim, local_v, 16, 8, 4, 2, g)
    staged = layer._core_staged(*step, conv_cache.clone(), recurrent_cache.clone(), rows)
    real_cat = torch.cat

    def misordered(tensors, dim=0):
        parts = list(tensors)
        if len(parts) == 4:  # the adapter's [mixed_qkv, z, b, a]
            parts = [parts[0], parts[2], parts[3], parts[1]]
        return real_cat(parts, dim=dim)

    monkeypatch.setattr(served_gdn.torch, "cat", misordered)
    fused = layer._core_triton(*step, conv_cache.clone(), recurrent_cache.clone(), rows)
    assert relative_error(fused, staged) > 100 * GDN_DECODE_LAYER["triton"][F32]


def test_rows_ignored_by_the_kernel_would_fail(monkeypatch):
    """The check itself: a kernel reading row b instead of rows[b] (the INDEXED branch dropped) fails it."""
    from model.gdn import triton_decode_layer

    layer, conv_dim, _, local_v, g = served_layer(2, 4, 16, 8, 4, 1, seed=1)
    step, conv_cache, recurrent_cache, rows = step_inputs(conv_dim, local_v, 16, 8, 4, 3, g)
    rows = torch.tensor([5, 3, 1], dtype=torch.int32)
    staged = layer._core_staged(*step, conv_cache.clone(), recurrent_cache.clone(), rows)
    real = triton_decode_layer.fused_decode_core
    monkeypatch.setattr(triton_decode_layer, "fused_decode_core",
                        lambda proj, w, state, out_state, rows=None: real(proj, w, state, out_state))
    fused = layer._core_triton(*step, conv_cache.clone(), recurrent_cache.clone(), rows)
    assert relative_error(fused, staged) > 100 * GDN_DECODE_LAYER["triton"][F32]
