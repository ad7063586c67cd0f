"""The served ops on a GPU at the real per-rank dims (Qwen3.6-35B-A3B at TP=4): called eagerly, compiled with
torch.compile(fullgraph=True) (inductor) and captured in a CUDA graph, each gives what the substitute's eager code
gives, and the choice inside is made at run time (the call is counted as served, by the path the table or forcing
names on this GPU).

No vLLM here (the GPU machines have no CUDA build of it): each op's layer is a stand-in whose eager code is the
substitute's own vLLM-free part (served_norms.add_norm_by_table, gated_norm_by_table, served_moe.block_by_table,
served_gdn.fused_core over in-place state rows); vLLM's adapters around them are the CPU server tests'.
"""
from __future__ import annotations

import pytest
import torch

from harness.tune.measure.dims import REAL_PER_RANK
from harness.tune.measure.inputs import gated_norm_inputs, gdn_weights, moe_hidden, moe_weights
from model.moe import MoEConfig
from patches.model_paths import served_choice, served_gdn, served_moe, served_norms, served_ops

pytestmark = pytest.mark.gpu

BATCHES = (1, 8)
HIDDEN = REAL_PER_RANK.moe.hidden
DTYPE = torch.bfloat16


@pytest.fixture(autouse=True)
def forced():
    """The model's serving choice where this GPU's table has no row (its own rows where it has them)."""
    served_choice.configure(True)
    served_moe._Runtime.config = MoEConfig()
    served_choice.SERVED.clear()
    yield
    served_choice.configure(False)
    served_moe._Runtime.config = None


class StandIn:
    def __init__(self, eager) -> None:
        self._qwen36_eager = eager


def named(block: str, eager) -> tuple[StandIn, str]:
    """A stand-in and the name its op finds it by; the caller holds the stand-in (the ops' registry is weak)."""
    layer = StandIn(eager)
    return layer, served_ops.name_layer(layer, block)


def assert_same(got, want, again) -> None:
    """`got` equals `want` bit for bit where the direct call reproduces itself bit for bit (`again`), else within
    the direct call's own run-to-run difference."""
    for g, w, a in zip(got, want, again, strict=True):
        if torch.equal(w, a):
            assert torch.equal(g, w), f"max abs diff {(g.float() - w.float()).abs().max().item():.3g}"
        else:
            own = (a.float() - w.float()).abs().max().item()
            assert (g.float() - w.float()).abs().max().item() <= 2 * own


def captured(call, inputs: list[torch.Tensor]):
    """`call` captured in a CUDA graph over static copies of `inputs`: (the static inputs, the static outputs,
    the graph)."""
    static = [t.clone() for t in inputs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(*static)
    return static, out, graph


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def check_op(block: str, op_call, direct, make_inputs) -> None:
    """Eager through the op, compiled (fullgraph) and graph-captured, each against `direct` on the same inputs."""
    inputs = make_inputs(0)
    want, again = as_tuple(direct(*inputs)), as_tuple(direct(*inputs))
    assert_same(as_tuple(op_call(*inputs)), want, again)
    compiled = torch.compile(op_call, fullgraph=True)
    assert_same(as_tuple(compiled(*inputs)), want, again)
    static, out, graph = captured(op_call, inputs)
    fresh = make_inputs(1)
    for s, f in zip(static, fresh):
        s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    assert_same(as_tuple(out), as_tuple(direct(*fresh)), as_tuple(direct(*fresh)))
    served = {path for (b, path), n in served_choice.SERVED.items() if b == block and n}
    assert served and served_choice.VLLM_OWN not in served, served_choice.SERVED
    print(f"\n{block}: served by {sorted(served)} on {torch.cuda.get_device_name()}: eager, compiled and "
          "graph-captured through the op equal the direct call")


@pytest.mark.parametrize("rows", BATCHES)
def test_the_add_norm_op_compiled_and_captured_equals_the_substitutes_call(rows):
    g = torch.Generator(device="cuda").manual_seed(rows)
    weight = torch.randn(HIDDEN, generator=g, device="cuda").to(DTYPE) * 0.3
    eps = 1e-6
    layer, name = named("add_rms_norm", lambda x, r: served_norms.add_norm_by_table(x, r, weight, eps))

    def make_inputs(seed):
        gen = torch.Generator(device="cuda").manual_seed(100 + seed)
        return [torch.randn(rows, HIDDEN, generator=gen, device="cuda").to(DTYPE) for _ in range(2)]

    check_op("add_rms_norm", lambda x, r: served_ops.served_add_rms_norm(x, r, name),
             lambda x, r: served_norms.add_norm_by_table(x, r, weight, eps), make_inputs)


@pytest.mark.parametrize("rows", BATCHES)
def test_the_gated_norm_op_compiled_and_captured_equals_the_substitutes_call(rows):
    d = REAL_PER_RANK.gdn
    weight = gated_norm_inputs(rows, d, DTYPE, torch.device("cuda"), seed=rows)[2]
    layer, name = named("gdn_gated_norm", lambda x, z: served_norms.gated_norm_by_table(x, z, weight, d.eps))

    def make_inputs(seed):
        a, b = gated_norm_inputs(rows, d, DTYPE, torch.device("cuda"), seed=200 + seed)[:2]
        return [a, b]

    check_op("gdn_gated_norm", lambda x, z: served_ops.served_gated_norm(x, z, name),
             lambda x, z: served_norms.gated_norm_by_table(x, z, weight, d.eps), make_inputs)


@pytest.mark.parametrize("tokens", BATCHES)
def test_the_moe_block_op_compiled_and_captured_equals_the_substitutes_call(tokens):
    weights = moe_weights(REAL_PER_RANK.moe, DTYPE, torch.device("cuda"))
    layer, name = named("moe_block", lambda h, logits: served_moe.block_by_table(h, lambda x: weights))

    def make_inputs(seed):
        return [moe_hidden(tokens, REAL_PER_RANK.moe, DTYPE, torch.device("cuda"), seed=300 + seed)]

    check_op("moe_block", lambda h: served_ops.served_moe_block(h, h, name),
             lambda h: served_moe.block_by_table(h, lambda x: weights), make_inputs)


class GDNStandIn:
    """A served GDN layer: the op carries the projected q/k/v rows; z, b, a and the caches are the layer's (a served
    layer's caches are its own, not the op's arguments). Its output goes through an output projection back to the
    input's width, as the served layer's out_proj brings it back to the hidden size: the op's contract (its fake
    implementation) is an output shaped as its input."""

    def __init__(self, weights, rows: torch.Tensor, out_proj: torch.Tensor) -> None:
        self.weights, self.rows, self.out_proj = weights, rows, out_proj
        self.z = self.b = self.a = self.conv = self.recurrent = None

    def bind(self, z, b, a, conv, recurrent) -> None:
        self.z, self.b, self.a, self.conv, self.recurrent = z, b, a, conv, recurrent

    def _qwen36_eager(self, qkv: torch.Tensor) -> torch.Tensor:
        normed = served_gdn.fused_core(qkv, self.z, self.b, self.a, self.weights, self.conv, self.recurrent,
                                       self.rows)
        return torch.nn.functional.linear(normed, self.out_proj)


@pytest.mark.parametrize("batch", BATCHES)
def test_the_gdn_core_op_compiled_and_captured_advances_the_state_rows_as_the_direct_call(batch):
    """The fused decode core over scattered state rows of a cache of more slots, in place: the op's output and the
    cache after it equal the direct call's, compiled and replayed from a graph too (the state rows are what a wrong
    capture would break)."""
    if served_gdn.triton_decode_layer is None:
        pytest.skip("no Triton here: the fused GDN decode core is Triton's")
    d, cuda = REAL_PER_RANK.gdn, torch.device("cuda")
    slots = 2 * batch + 3
    rows = torch.arange(slots - 1, slots - 1 - 2 * batch, -2, device=cuda, dtype=torch.int32)  # distinct, scattered
    out_proj = (torch.randn(d.conv_dim, d.value_dim, device=cuda) * d.value_dim ** -0.5).to(DTYPE)
    layer = GDNStandIn(gdn_weights(d, DTYPE, cuda), rows, out_proj)
    name = served_ops.name_layer(layer, "gdn_layer_decode")

    def make_inputs(seed):
        gen = torch.Generator(device=cuda).manual_seed(400 + seed)
        randn = lambda *shape: torch.randn(*shape, generator=gen, device=cuda)  # noqa: E731
        return [randn(batch, d.conv_dim).to(DTYPE), randn(batch, d.num_v_heads, d.head_v_dim).to(DTYPE),
                randn(batch, d.num_v_heads).to(DTYPE), randn(batch, d.num_v_heads).to(DTYPE),
                randn(slots, d.conv_dim, d.conv_kernel - 1).to(DTYPE),
                randn(slots, d.num_v_heads, d.head_k_dim, d.head_v_dim) * 0.1]

    def run(call, inputs):
        """(output, conv cache, recurrent cache) after `call` on copies of `inputs` bound to the layer."""
        qkv, *rest = [t.clone() for t in inputs]
        layer.bind(*rest)
        return call(qkv), rest[3], rest[4]

    direct = layer._qwen36_eager
    op_call = lambda qkv: served_ops.served_gdn_layer(qkv, name)  # noqa: E731
    inputs = make_inputs(0)
    want, again = run(direct, inputs), run(direct, inputs)
    assert_same(run(op_call, inputs), want, again)
    assert_same(run(torch.compile(op_call, fullgraph=True), inputs), want, again)
    layer.bind(*[t.clone() for t in inputs[1:]])  # the state the graph reads and writes, at fixed addresses
    state = [layer.z, layer.b, layer.a, layer.conv, layer.recurrent]
    static_qkv, out, graph = captured(op_call, inputs[:1])
    fresh = make_inputs(1)
    for s, f in zip([*static_qkv, *state], fresh):  # after the capture's warm-up calls: a fresh state and input
        s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    assert_same((out, state[3], state[4]), run(direct, fresh), run(direct, fresh))
