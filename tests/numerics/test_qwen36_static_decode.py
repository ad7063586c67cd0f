"""The decode step over a StaticDecodeCache against the dynamic step (Qwen36Cache), on the CPU, float32 and float64.

What is bit-equal and what is not:
- the GDN layer with its state updated in place (gdn_layer(..., in_place=True)) is gdn_layer: output and state bit-equal;
- the static attention writes bit-equal keys and values, but its output is not bit-equal: its core sums over
  all max_len positions (later ones masked) where the dynamic core sums over the cached ones, and SDPA's CPU
  kernel associates those sums by the key count (model/attention/layer.py gated_attention_static says where). It is
  held to model.tolerances.ATTENTION_CORES;
- so in the whole model, every layer before the first attention layer (its GDN state, its MoE block's output) is
  bit-equal, the first attention layer's keys and values are, and the logits agree to ATTENTION_CORES with the
  same greedy tokens. Layers after an attention layer see its rounding and are not claimed bit-equal.
And the static step is capturable: the same ops on the same shapes at every length, no host read, the same
buffers (tests/numerics/test_qwen36_static_decode_gpu.py captures it on CUDA).
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.tune.measure.inputs import attention_weights, gdn_weights, rank_config, rank_weights
from harness.tune.step.run import TINY_MODEL
from model.attention.layer import KVCache, StaticKVCache, gated_attention, gated_attention_static
from model.dispatch.table import TABLE_ENV
from model.gdn import GDNState, gdn_layer
from model.moe import MoEConfig
from model.qwen36 import CapturableDecodeStep, Qwen36Config, Qwen36Model, Qwen36Paths, StaticDecodeCache
from model.tolerances import ATTENTION_CORES
from tests.numerics.compare import relative_error

DTYPES = (torch.float32, torch.float64)
CPU = torch.device("cpu")
STEPS = 8
PREFILL = 6
BATCH = 3  # the knobs serve B <= 4 with capturable MoE paths (tiny_tokenwise), B > 4 with `sorted`

# TINY_MODEL's layers: GDN, GDN, GDN, attention. ATTENTION_FIRST puts an attention layer before GDN layers, so the
# attention's rounding reaches GDN and MoE blocks downstream.
ATTENTION_FIRST = {**TINY_MODEL, "layer_types": ["linear_attention", "full_attention", "linear_attention",
                                                 "full_attention"]}


@pytest.fixture(autouse=True)
def _no_dispatch_table(monkeypatch):
    monkeypatch.setenv(TABLE_ENV, "off")  # the knobs choose the paths, whatever table this machine has


def tiny_model(dtype: torch.dtype, config: dict = TINY_MODEL, paths: Qwen36Paths | None = None) -> Qwen36Model:
    cfg = rank_config(Qwen36Config.from_hf_dict(config), 1)
    return Qwen36Model(rank_weights(cfg, dtype, CPU, seed=3), paths)


def prompt(model: Qwen36Model, batch: int = BATCH, tokens: int = PREFILL, seed: int = 5) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def record_mlp_outputs(model: Qwen36Model) -> list[torch.Tensor]:
    """Every MLP block output of later forwards, in call order (a spy on the instance's _mlp)."""
    outputs, mlp = [], model._mlp

    def spy(h, w):
        out = mlp(h, w)
        outputs.append(out.clone())
        return out

    model._mlp = spy
    return outputs


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_layer_in_place_is_gdn_layer_bit_for_bit(dtype):
    cfg = rank_config(Qwen36Config.from_hf_dict(TINY_MODEL), 1)
    w = gdn_weights(cfg.gdn_dims, dtype, CPU, 7)
    gen = torch.Generator().manual_seed(1)
    _, state = gdn_layer(torch.randn(2, PREFILL, cfg.hidden_size, generator=gen, dtype=dtype), w)
    buffers = GDNState(state.conv.clone(), state.recurrent.clone())
    addresses = (buffers.conv.data_ptr(), buffers.recurrent.data_ptr())
    for _ in range(STEPS):
        x = torch.randn(2, 1, cfg.hidden_size, generator=gen, dtype=dtype)
        y, state = gdn_layer(x, w, state, rule=None, conv=None, norm=None)
        y_static, returned = gdn_layer(x, w, buffers, rule=None, conv=None, norm=None, in_place=True)
        assert returned is buffers
        assert torch.equal(y, y_static)
        assert torch.equal(state.conv, buffers.conv) and torch.equal(state.recurrent, buffers.recurrent)
    assert (buffers.conv.data_ptr(), buffers.recurrent.data_ptr()) == addresses


@pytest.mark.parametrize("core", ("sdpa", "reference"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_static_attention_writes_the_same_keys_and_agrees_to_the_attention_bound(dtype, core):
    cfg = rank_config(Qwen36Config.from_hf_dict(TINY_MODEL), 1)
    w = attention_weights(cfg.attention_dims, dtype, CPU, 7)
    gen = torch.Generator().manual_seed(2)
    _, dynamic = gated_attention(torch.randn(2, PREFILL, cfg.hidden_size, generator=gen, dtype=dtype), w, core=core)
    max_len = PREFILL + STEPS + 5  # masked positions past the last step too
    length = torch.tensor(PREFILL)
    static = StaticKVCache.holding(dynamic, max_len, length)
    worst = 0.0
    for _ in range(STEPS):
        x = torch.randn(2, 1, cfg.hidden_size, generator=gen, dtype=dtype)
        y, dynamic = gated_attention(x, w, dynamic, core=core)
        y_static, _ = gated_attention_static(x, w, static, core=core)
        length.add_(1)  # the owner's job (StaticDecodeCache.advance)
        worst = max(worst, relative_error(y_static, y))
    assert worst <= ATTENTION_CORES[core][dtype], f"static attention output off by {worst:.2e}"
    assert torch.equal(static.k[:, :, : dynamic.length], dynamic.k)
    assert torch.equal(static.v[:, :, : dynamic.length], dynamic.v)
    assert not static.k[:, :, dynamic.length :].any()  # nothing written past the steps taken


def decode_both_ways(model: Qwen36Model, steps: int = STEPS):
    """Prefill, then `steps` decode steps on the dynamic cache and on a static cache with slack past the last
    step, both fed the dynamic step's greedy tokens. Returns per step (dynamic logits, static logits, dynamic
    MLP outputs by layer, static MLP outputs by layer), and the two caches after the steps."""
    logits, cache = model.forward(prompt(model))
    step = CapturableDecodeStep.from_prefill(model, cache, PREFILL + steps + 4)
    layers = model.config.num_hidden_layers
    mlp_outputs = record_mlp_outputs(model)
    per_step = []
    tokens = logits[:, -1:].argmax(-1)
    for _ in range(steps):
        dynamic, cache = model.forward(tokens, cache)
        static = step.run(tokens)
        calls = mlp_outputs[-2 * layers:]  # this step's: the dynamic forward's layers, then the static one's
        per_step.append((dynamic, static, calls[:layers], calls[layers:]))
        tokens = dynamic[:, -1:].argmax(-1)
    return per_step, cache, step.cache


@pytest.mark.parametrize("config", (TINY_MODEL, ATTENTION_FIRST), ids=("attention_last", "attention_second"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_static_decode_equals_dynamic_decode(dtype, config):
    model = tiny_model(dtype, config)
    per_step, dynamic_cache, static_cache = decode_both_ways(model)
    kinds = model.config.layer_types
    first_attention = kinds.index("full_attention")
    worst = 0.0
    for i, (dynamic, static, dynamic_mlp, static_mlp) in enumerate(per_step):
        # Before the first attention layer every block sees the same input: the MoE outputs are the same bits.
        for layer in range(first_attention):  # (the attention layer's own MoE block sees its output: not bits)
            assert torch.equal(dynamic_mlp[layer], static_mlp[layer]), f"step {i}: layer {layer}'s MoE output"
        worst = max(worst, relative_error(static, dynamic))
        assert torch.equal(static.argmax(-1), dynamic.argmax(-1)), f"step {i}: greedy tokens differ"
    assert worst <= ATTENTION_CORES["sdpa"][dtype], f"logits off by {worst:.2e}"
    for layer, (dyn, stat) in enumerate(zip(dynamic_cache.layers, static_cache.layers)):
        if layer < first_attention:  # GDN layers before any attention: state bit-equal after every step
            assert torch.equal(dyn.conv, stat.conv) and torch.equal(dyn.recurrent, stat.recurrent), f"layer {layer}"
        elif layer == first_attention:  # its input is bit-equal, so are the keys and values it wrote
            assert torch.equal(stat.k[:, :, : dyn.length], dyn.k) and torch.equal(stat.v[:, :, : dyn.length], dyn.v)
    assert int(static_cache.length) == dynamic_cache.length == PREFILL + STEPS


# Ops that read a device value on the host (a CUDA synchronisation, refused inside a capture) or whose output
# shape depends on values. `Tensor.tolist` reaches no op on a CPU tensor, so it is spied on separately.
HOST_READS = ("aten._local_scalar_dense", "aten.nonzero", "aten.unique", "aten._unique", "aten.masked_select")


class OpLog(TorchDispatchMode):
    """Every op a forward dispatches, with its outputs' shapes, and the host reads among them."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []
        self.host_reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func)
        flat = out if isinstance(out, (tuple, list)) else (out,)
        self.ops.append((name, tuple(tuple(t.shape) for t in flat if isinstance(t, torch.Tensor))))
        if name.startswith(HOST_READS):
            self.host_reads.append(name)
        return out


def logged(run, monkeypatch) -> OpLog:
    log = OpLog()
    tolist = torch.Tensor.tolist

    def spied_tolist(t):
        log.host_reads.append("Tensor.tolist")
        return tolist(t)

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "tolist", spied_tolist)
        with log:
            run()
    return log


def test_the_static_step_runs_the_same_ops_on_the_same_buffers_at_every_length(monkeypatch):
    """What a captured graph needs: one step's ops and every intermediate's shape do not depend on the length,
    nothing is read back to the host, and the state stays at the same addresses, so a graph captured at one
    length replays at another."""
    model = tiny_model(torch.float32)
    short, long_ = (model.forward(prompt(model, tokens=t, seed=t))[1] for t in (2, 9))
    step = CapturableDecodeStep.from_prefill(model, short, 16)
    addresses = [t.data_ptr() for t in step.cache.tensors()]
    ids = torch.tensor([[1], [2], [3]])
    at_short = logged(lambda: step.run(ids), monkeypatch)
    step.load(long_)
    at_long = logged(lambda: step.run(ids), monkeypatch)
    assert int(step.cache.length) == 9 + 1
    assert at_short.ops == at_long.ops and at_short.ops
    assert at_short.host_reads == at_long.host_reads == []
    assert [t.data_ptr() for t in step.cache.tensors()] == addresses


def test_the_op_log_sees_what_a_capture_refuses(monkeypatch):
    """The check above can fail: the dynamic step's shapes follow the length, and the `sorted` MoE path (what
    the knobs serve for B > 4 without a dispatch table) reads the expert counts back to the host."""
    model = tiny_model(torch.float32)
    ids = torch.tensor([[1], [2], [3]])
    short, long_ = (model.forward(prompt(model, tokens=t, seed=t))[1] for t in (2, 9))
    dynamic = [logged(lambda c=c: model.forward(ids, c), monkeypatch) for c in (short, long_)]
    assert [op for op, _ in dynamic[0].ops] == [op for op, _ in dynamic[1].ops] and dynamic[0].ops != dynamic[1].ops
    sorted_moe = Qwen36Model(model.weights, Qwen36Paths(moe=MoEConfig(decode_native=False, tiny_max=0)))
    step = CapturableDecodeStep.from_prefill(sorted_moe, short, 16)
    assert "Tensor.tolist" in logged(lambda: step.run(ids), monkeypatch).host_reads


def test_the_step_refuses_a_position_past_max_len_without_touching_the_cache():
    model = tiny_model(torch.float32)
    _, cache = model.forward(prompt(model))
    step = CapturableDecodeStep.from_prefill(model, cache, PREFILL + 2)
    ids = torch.zeros(BATCH, 1, dtype=torch.int64)
    start = step.snapshot()
    step.run(ids)
    step.run(ids)
    before = step.cache.snapshot()
    with pytest.raises(ValueError, match="static cache is full"):
        step.run(ids)
    assert all(torch.equal(a, b) for a, b in zip(before, step.cache.snapshot()))
    step.restore(start)  # a snapshot rewinds the buffers and the host count together
    assert step.position == PREFILL and int(step.cache.length) == PREFILL
    step.run(ids)


def test_a_static_cache_needs_a_prefill_and_room_for_a_step():
    model = tiny_model(torch.float32)
    with pytest.raises(ValueError, match="prefill"):
        StaticDecodeCache.from_prefill(model.new_cache(), 8)
    _, cache = model.forward(prompt(model))
    with pytest.raises(ValueError, match="no room"):
        StaticDecodeCache.from_prefill(cache, PREFILL)
    with pytest.raises(ValueError, match="does not fit"):
        StaticKVCache.holding(KVCache(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2)), 4, torch.tensor(5))
