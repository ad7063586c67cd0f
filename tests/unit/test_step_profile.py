"""harness.serving.step_profile on synthetic traces in the torch profiler's format: which steps count, which block
kind an operator belongs to, the ranges of data-dependent counts, and the gate's findings."""
from __future__ import annotations

import gzip
import json

import pytest

from harness.errors import HarnessError
from harness.serving.step_profile import (
    KINDS, block_kind, computes, count_growth, decode_step_counts, profiler_args,
)


def event(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def step(ts: float, prefill: int, decode: int, layers: list[tuple[str, int]]) -> list[dict]:
    """A step annotation at `ts` holding, per (module class, n ops), a module event with n ops inside, then one op
    under no module (the logits)."""
    events = [event("user_annotation", f"execute_context_{prefill}({prefill * 9})_generation_{decode}({decode})",
                    ts, 1000)]
    t = ts + 1
    for cls, n in layers:
        events.append(event("python_function", f"nn.Module: {cls}_0", t, 10 * n + 2))
        events.append(event("python_function", "torch/nn/modules/linear.py(130): forward", t + 0.5, 1))
        events += [event("cpu_op", "aten::mm", t + 1 + 10 * i, 5) for i in range(n)]
        t += 10 * n + 5
    events.append(event("cpu_op", "aten::argmax", t, 1))
    return events


def write(tmp_path, events: list[dict], name: str = "rank0.pt.trace.json.gz"):
    path = tmp_path / name
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


DECODER = [("ServedGemmaRMSNorm", 1), ("QwenGatedDeltaNetAttention", 3), ("Qwen3NextSparseMoeBlock", 2),
           ("Qwen3NextAttention", 2)]


def test_kinds_come_from_the_innermost_module_with_a_kind():
    assert [block_kind(c) for c, _ in DECODER] == ["norm", "gdn", "moe", "attention"]
    assert block_kind("RMSNormGated") == "norm" and block_kind("ServedQwenGatedDeltaNet") == "gdn"
    assert block_kind("ColumnParallelLinear") is None and block_kind("Qwen3NextDecoderLayer") is None


def test_only_decode_steps_of_the_batch_count_and_ops_outside_a_kind_are_other(tmp_path):
    events = (step(0, 1, 0, [("GemmaRMSNorm", 50)])  # a prefill step: not counted
              + step(2000, 0, 1, DECODER) + step(4000, 0, 1, DECODER)
              + step(6000, 0, 2, DECODER + DECODER))  # another batch
    counts = decode_step_counts([write(tmp_path, events)], batch=1)
    assert counts.steps == 2
    assert {k: v for k, v in counts.as_json().items() if k != "plugin"} == {
        "total": 9, "norm": 1, "gdn": 3, "moe": 2, "attention": 2, "other": 1}
    assert counts.as_json()["plugin"] == dict.fromkeys(("total", *KINDS), 0)  # no frame of the plugin's code


def test_a_nested_module_counts_as_its_own_kind(tmp_path):
    # The GDN layer's gated norm is inside the GDN layer's module: its ops are the norm's.
    events = step(0, 0, 1, [("QwenGatedDeltaNetAttention", 4)])
    events.append(event("python_function", "nn.Module: RMSNormGated_0", 1 + 20, 5))  # holds the 3rd op only
    counts = decode_step_counts([write(tmp_path, events)], batch=1)
    assert counts.as_json()["gdn"] == 3 and counts.as_json()["norm"] == 1


def test_a_count_that_varies_between_steps_is_a_range_and_is_not_gated(tmp_path):
    events = step(0, 0, 8, DECODER) + step(2000, 0, 8, DECODER[:2] + [("Qwen3NextSparseMoeBlock", 5)] + DECODER[3:])
    counts = decode_step_counts([write(tmp_path, events)], batch=8).as_json()
    del counts["plugin"]
    assert counts["moe"] == [2, 5] and counts["gdn"] == 3 and counts["total"] == [9, 12]
    assert count_growth(counts, {**counts, "moe": 99, "total": 99}) == []


def test_the_gate_names_the_kind_and_the_difference():
    recorded = {"total": 10, "norm": 4, "gdn": 6, "moe": 0, "attention": 0, "other": 0}
    assert count_growth(recorded, recorded) == []
    assert count_growth(recorded, {**recorded, "norm": 3, "total": 9}) == []  # fewer: passes (re-record)
    assert count_growth(recorded, {**recorded, "gdn": 8, "total": 12}) == ["total: 10 -> 12 (+2)", "gdn: 6 -> 8 (+2)"]
    assert count_growth(recorded, {**recorded, "gdn": [6, 7]}) == [
        "gdn: 6 -> 6..7 (deterministic before, now varies between steps)"]


def test_no_step_of_the_batch_is_an_error_naming_the_annotation(tmp_path):
    with pytest.raises(HarnessError, match=r"execute_context_0\(0\)_generation_4"):
        decode_step_counts([write(tmp_path, step(0, 0, 1, DECODER))], batch=4)


def test_the_profiler_arguments_are_vllms_profiler_config_with_an_absolute_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flag, value = profiler_args("traces")
    config = json.loads(value)
    assert flag == "--profiler-config" and config["profiler"] == "torch"
    assert config["torch_profiler_dir"] == str(tmp_path / "traces") and config["torch_profiler_with_stack"] is True
    assert set(KINDS) == {"norm", "gdn", "moe", "attention", "other"}


def frame(name: str, ts: float, dur: float) -> dict:
    return event("python_function", name, ts, dur)


def served_gdn_layer(ts: float) -> list[dict]:
    """A served GDN layer's call: vLLM's projection (its frame, an op inside), then the plugin's core calling torch
    ops (two that compute, one nested inside another, a view and a torch.nn.functional wrapper's op), then vLLM's
    out_proj."""
    return [
        frame("nn.Module: ServedQwenGatedDeltaNet_0", ts, 100),
        frame("patches/model_paths/served_gdn.py(190): _served_decode", ts + 1, 98),
        frame("vllm/model_executor/layers/linear.py(400): forward", ts + 2, 10),
        event("cpu_op", "_C::onednn_mm", ts + 3, 5),  # vLLM's
        frame("model/gdn/staged.py(98): staged_core", ts + 20, 50),
        frame("<built-in method index_select of Tensor object at 0x7f>", ts + 21, 4),
        event("cpu_op", "aten::index_select", ts + 21.5, 3),  # the plugin's: counted
        event("cpu_op", "aten::transpose", ts + 26, 1),  # a view: not counted
        event("cpu_op", "aten::to", ts + 28, 6),  # may return its input: not counted...
        event("cpu_op", "aten::_to_copy", ts + 29, 4),  # ...nor what it calls (nested)
        frame("torch/nn/functional.py(2200): silu", ts + 40, 5),  # passed through to the plugin's frame
        event("cpu_op", "aten::silu", ts + 41, 3),  # the plugin's: counted
        frame("vllm/model_executor/layers/linear.py(1400): forward", ts + 80, 10),
        event("cpu_op", "aten::mm", ts + 81, 5),  # vLLM's out_proj
    ]


def test_the_plugins_own_calls_are_the_top_level_ops_of_its_frames_by_kind(tmp_path):
    events = [event("user_annotation", "execute_context_0(0)_generation_1(1)", 0, 1000)]
    events += served_gdn_layer(10) + served_gdn_layer(200)
    events.append(event("cpu_op", "aten::argmax", 900, 1))  # outside any frame: vLLM's sampler, not the plugin's
    counts = decode_step_counts([write(tmp_path, events)], batch=1).as_json()
    assert counts["plugin"] == {"total": 4, "norm": 0, "gdn": 4, "moe": 0, "attention": 0, "other": 0}
    assert counts["gdn"] == 2 * 7 and counts["other"] == 1  # the whole step's count holds everything


def compiled_served_gdn_layer(ts: float) -> list[dict]:
    """The same call in a compiled server: no module event (Dynamo inlined the module), the served op around it, and
    the torch.library wrapper's frames between the op and the plugin's."""
    inner = [e for e in served_gdn_layer(ts) if not e["name"].startswith("nn.Module")]
    return [event("cpu_op", "## Call CompiledFxGraph fabc123 ##", ts - 1, 102),  # torch.compile's marker
            event("cpu_op", "qwen36::served_gdn_layer", ts, 100),
            frame("torch/_library/custom_ops.py(300): __call__", ts + 0.5, 99), *inner]


def test_in_a_compiled_server_the_plugins_calls_inside_a_served_op_count_as_in_an_eager_one(tmp_path):
    eager = [event("user_annotation", "execute_context_0(0)_generation_1(1)", 0, 1000)] + served_gdn_layer(10)
    compiled = [event("user_annotation", "execute_context_0(0)_generation_1(1)", 0, 1000)]
    compiled += compiled_served_gdn_layer(10)
    plugin = decode_step_counts([write(tmp_path, eager, "eager.json.gz")], batch=1).as_json()["plugin"]
    assert plugin == decode_step_counts([write(tmp_path, compiled, "compiled.json.gz")], batch=1).as_json()["plugin"]
    assert plugin["gdn"] == 2
    # Any other operator holding the plugin's calls still hides them (one call of vLLM's own op counts as vLLM's).
    held = [{**e, "name": "vllm::moe_forward"} if e["name"] == "qwen36::served_gdn_layer" else e for e in compiled]
    assert decode_step_counts([write(tmp_path, held, "held.json.gz")], batch=1).as_json()["plugin"]["total"] == 0


def test_what_computes_is_told_by_the_op_schema():
    assert computes("aten::mm") and computes("aten::index_select") and computes("_C::onednn_mm")
    assert not computes("aten::transpose") and not computes("aten::to") and not computes("aten::reshape")
    assert not computes("aten::empty") and not computes("profiler::_record_function_enter_new")
    assert not computes("## Call CompiledFxGraph fabc123 ##")
