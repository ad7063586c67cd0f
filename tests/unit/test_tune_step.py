"""`qwen36 tune step` on a CPU at tiny dims: the whole per-rank decode step timed, split by block kind through
the model's `trace` hook, beside HBM floors; the per-rank random weights and the floor arithmetic."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType

import model.qwen36.model as qwen36_model
from harness.cli import main
from harness.tune.measure import dims as D
from harness.tune.measure.floors import decode_step_bytes
from harness.tune.measure.inputs import rank_config, rank_weights
from harness.tune.measure.point import Settings
from harness.tune.measure.timing import L2Flusher, Timing
from harness.tune.step import graph as step_graph
from harness.tune.step.graph import CHECK_STEPS, GraphResult, measure_static_step
from harness.tune.step.report import format_step_table, write_step_report
from harness.tune.measure.launch_count import count_device_work
from harness.tune.step.run import QWEN36_35B_A3B, TINY_MODEL, BlockClock, StepRow
from model.attention.layer import gated_attention
from model.gdn import gdn_layer
from model.moe import moe_block
from model.norm.rms_norm import RMS_NORM_PATHS
from model.qwen36 import Qwen36Config, Qwen36Model
from model.tolerances import ATTENTION_CORES

BATCHES = (1, 3, 5)


def tiny_rank_model(tp: int = 4) -> Qwen36Model:
    return Qwen36Model(rank_weights(rank_config(Qwen36Config.from_hf_dict(TINY_MODEL), tp), torch.float32,
                                    torch.device("cpu"), seed=3))


def prefilled(model: Qwen36Model, batch: int = 2, prompt: int = 6):
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(5))
    logits, cache = model.forward(ids)
    return logits[:, -1].argmax(-1, keepdim=True), cache


def test_the_command_writes_one_row_per_batch_with_every_block_kind(tmp_path):
    code = main(["tune", "step", "--dims", "tiny", "--device", "cpu", "--reps", "3", "--warmup", "1", "--no-progress",
                 "--step-batches", ",".join(map(str, BATCHES)), "--step-prefill", "8", "--hbm-tbps", "1",
                 "--report-dir", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "step.json").read_text())
    md = (tmp_path / "step.md").read_text()
    rows = report["rows"]
    assert [r["batch"] for r in rows] == list(BATCHES)
    cfg = Qwen36Config.from_hf_dict(TINY_MODEL)
    # The kinds this model has, from its config: both mixers must be present for the test to cover them.
    assert {"linear_attention", "full_attention"} <= set(cfg.layer_types)
    expected = {"embed", "norm", "lm_head", "gdn", "attention"}
    expected |= {"moe" if cfg.is_moe_layer(i) else "mlp" for i in range(cfg.num_hidden_layers)}
    for r in rows:
        assert r["status"] == "ok", r["detail"]
        assert r["context"] == 8 + 1
        assert r["tokens_per_s"] == pytest.approx(r["batch"] / (r["step"]["median_us"] * 1e-6))
        assert set(r["kinds_us"]) == expected | {"other"}
        assert all(r["kinds_us"][k] > 0 for k in expected), r["kinds_us"]
        assert set(r["bytes"]) == expected and all(r["floor_us"][k] > 0 for k in expected)
        assert r["kernels"] is None  # no CUDA: not counted
        assert f"\n| {r['batch']} | " in md
        # The static-cache step runs eagerly on any device; its graph only on CUDA.
        graph = r["graph"]
        assert graph["status"] == "n/a (CUDA only)" and graph["replay"] is None
        assert graph["max_len"] == 8 + CHECK_STEPS and graph["static_eager"]["samples"] == 3
        assert graph["static_vs_dynamic_rel_err"] <= ATTENTION_CORES["sdpa"][torch.float32]
        assert f"\n| {r['batch']} | n/a (CUDA only) | {8 + CHECK_STEPS} | " in md
        # The same step through the served ops (harness/tune/step/through_ops.py): the same logits, bit for bit.
        ops = r["through_ops"]
        assert ops["logits_equal_direct"] is True and ops["step"]["samples"] == 3, ops
        assert ops["graph"]["static_eager"]["samples"] == 3 and ops["graph"]["static_vs_dynamic_rel_err"] == \
            graph["static_vs_dynamic_rel_err"]
    assert "## Through the served ops" in md
    assert "## Graph replay" in md and "## Floor assumptions" in md and report["floor_assumptions"]
    assert "n/a (CUDA only)" in md.split("## Decode step")[1].split("\n\n")[1]  # the graph column of the step table


def test_step_refuses_the_gate_flags(capsys):
    assert main(["tune", "step", "--dims", "tiny", "--device", "cpu", "--check"]) == 2
    assert "--check" in capsys.readouterr().err


def test_the_trace_hook_changes_no_result_and_sees_every_block():
    model = tiny_rank_model()
    ids, cache = prefilled(model)
    plain, plain_cache = model.forward(ids, cache)
    kinds = []

    def recording(kind):
        kinds.append(kind)
        return BlockClock(torch.device("cpu"))(kind)

    traced, traced_cache = model.forward(ids, cache, trace=recording)
    assert torch.equal(plain, traced)
    for a, b in zip(plain_cache.layers, traced_cache.layers):
        assert all(torch.equal(x, y) for x, y in zip(vars(a).values(), vars(b).values()))
    cfg = model.config
    per_layer = [["norm", "gdn" if kind == "linear_attention" else "attention", "norm",
                  "moe" if cfg.is_moe_layer(i) else "mlp"] for i, kind in enumerate(cfg.layer_types)]
    assert kinds == ["embed", *sum(per_layer, []), "norm", "lm_head"]


def test_the_untraced_step_is_the_blocks_composed_as_before(monkeypatch):
    """No hook: exactly the pre-hook forward (restated here from its blocks), and nothing is wrapped."""
    model = tiny_rank_model()
    ids, cache = prefilled(model)
    w, rms, eps = model.weights, RMS_NORM_PATHS["fused"].fn, model.config.rms_norm_eps
    h = F.embedding(ids, w.embed)
    for layer, state in zip(w.layers, cache.layers):
        x = rms(h, layer.input_norm, eps)
        mix = gdn_layer if layer.kind == "linear_attention" else gated_attention
        h = h + mix(x, layer.mixer, state)[0]
        flat = rms(h, layer.post_norm, eps).reshape(-1, h.shape[-1])
        h = h + moe_block(flat, layer.mlp).reshape(h.shape)
    expected = F.linear(rms(h, w.final_norm, eps), w.lm_head)

    def no_wrapping(*args):
        raise AssertionError("forward wrapped a block without a trace")

    monkeypatch.setattr(qwen36_model, "_traced", no_wrapping)
    assert torch.equal(model.forward(ids, cache)[0], expected)


# A config of the whole model whose numbers differ from each other, so a swapped or undivided dim shows.
SHARDED = {
    **TINY_MODEL, "vocab_size": 1000, "hidden_size": 48, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
    "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 20, "linear_value_head_dim": 24,
    "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 40, "shared_expert_intermediate_size": 56,
}


@pytest.mark.parametrize("tp", (1, 2, 4))  # 2 kv heads: whole, divided, replicated
def test_the_rank_weights_have_the_shapes_of_one_rank(tp):
    full = Qwen36Config.from_hf_dict(SHARDED)
    cfg = rank_config(full, tp)
    w = rank_weights(cfg, torch.float32, torch.device("cpu"))
    rows = -(-full.vocab_size // 64) * 64 // tp  # vLLM pads the vocabulary to a multiple of 64, then splits it
    assert w.lm_head.shape == w.embed.shape == (rows, full.hidden_size)
    kv_heads = max(1, full.num_key_value_heads // tp)  # replicated when there are fewer kv heads than ranks
    attention = next(layer for layer in w.layers if layer.kind == "full_attention")
    assert attention.mixer.q_proj.shape == (2 * full.num_attention_heads // tp * full.head_dim, full.hidden_size)
    assert attention.mixer.k_proj.shape == (kv_heads * full.head_dim, full.hidden_size)
    assert attention.mixer.o_proj.shape == (full.hidden_size, full.num_attention_heads // tp * full.head_dim)
    gdn = next(layer for layer in w.layers if layer.kind == "linear_attention").mixer
    key_dim = full.linear_num_key_heads // tp * full.linear_key_head_dim
    value_dim = full.linear_num_value_heads // tp * full.linear_value_head_dim
    assert gdn.in_proj_qkv.shape == (2 * key_dim + value_dim, full.hidden_size)
    assert gdn.out_proj.shape == (full.hidden_size, value_dim)
    moe = w.layers[0].mlp
    assert moe.w13.shape == (full.num_experts, 2 * full.moe_intermediate_size // tp, full.hidden_size)
    assert moe.router.shape == (full.num_experts, full.hidden_size)  # every rank routes over all experts
    assert moe.shared_w1.shape == (full.shared_expert_intermediate_size // tp, full.hidden_size)
    assert len(w.layers) == full.num_hidden_layers


def test_the_built_in_models_split_into_the_tuners_per_rank_dims():
    for model_config, dims in ((QWEN36_35B_A3B, D.REAL_PER_RANK), (TINY_MODEL, D.TINY)):
        cfg = rank_config(Qwen36Config.from_hf_dict(model_config), 4)
        assert cfg.gdn_dims == dims.gdn
        assert cfg.attention_dims == dims.attention
        assert (cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
                cfg.shared_expert_intermediate_size) == tuple(vars(dims.moe).values())
    assert rank_config(Qwen36Config.from_hf_dict(SHARDED), 4).vocab_size == 1024 // 4  # 1000 padded to 1024
    with pytest.raises(ValueError, match="num_attention_heads"):
        rank_config(Qwen36Config.from_hf_dict({**SHARDED, "num_attention_heads": 6}), 4)


def test_the_step_floor_bytes_by_hand():
    cfg = Qwen36Config.from_hf_dict({
        **TINY_MODEL, "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
        "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 4, "linear_value_head_dim": 4,
        "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 2,
        "shared_expert_intermediate_size": 2,
    })
    # B = 2 sequences that have seen 5 tokens; bf16 (2 bytes), float32 state. Key dim 4, value dim 8, conv dim 16.
    gdn = ((16 * 8 + 8 * 8 + 2 * 8 + 2 * 8 + 16 * 4 + 2 + 2 + 4 + 8 * 8) * 2  # qkv, z, b, a, conv, A, dt, norm, out
           + 2 * (2 * 16 * 3 * 2 + 2 * 2 * 4 * 4 * 4)  # conv window and recurrent state, read and written
           + 2 * 2 * 8 * 2)  # x in, y out
    attention = ((16 * 8 + 4 * 8 + 4 * 8 + 8 * 8 + 4 + 4) * 2  # q (+ gate), k, v, o, q/k norms
                 + (2 * 2 * 4 * 5 + 2 * 2 * 4) * 2  # K and V of 5 positions read, the new one's written
                 + 2 * 2 * 8 * 2)
    # 2 tokens x top-2 of 4 experts visit 4 (1 - (1/2)^2) = 3 on average.
    moe_layer = (3 * 3 * 2 * 8 * 2  # the visited experts' w13 and w2
                 + (4 * 8 + 3 * 2 * 8 + 8) * 2  # router, shared expert, its gate
                 + 2 * 2 * 8 * 2 + 2 * 2 * (4 + 8))  # x in, out; routing weights and ids
    expected = {"embed": 2 * 2 * 8 * 2 + 2 * 8, "gdn": gdn, "attention": attention, "moe": 2 * moe_layer,
                # the first norm (weight, x in, y out), then 4 residual adds + norms (weight; h, y in; sum, x out)
                "norm": (8 + 2 * 2 * 8) * 2 + 4 * (8 + 4 * 2 * 8) * 2, "lm_head": (16 * 8 + 2 * 8 + 2 * 16) * 2}
    assert decode_step_bytes(cfg, batch=2, context=5, elem=2, state_elem=4) == pytest.approx(expected)


def test_kernel_counting_keeps_device_kernels_only():
    def event(device, activity, name):
        return SimpleNamespace(device_type=device, activity_type=activity, name=name)

    events = [event(DeviceType.CPU, "cpu_op", "aten::mm"), event(DeviceType.CPU, "cuda_runtime", "cudaLaunchKernel"),
              event(DeviceType.CUDA, "kernel", "void gemv<bf16>"), event(DeviceType.CUDA, "kernel", "triton_decode"),
              event(DeviceType.CUDA, "gpu_memcpy", "Memcpy DtoD (Device -> Device)"),
              event(DeviceType.CUDA, "gpu_memset", "Memset (Device)"),
              event(DeviceType.CUDA, "gpu_user_annotation", "forward"),
              event(DeviceType.CUDA, None, "Memcpy HtoD (Pageable -> Device)"), event(DeviceType.CUDA, None, "k2")]
    assert count_device_work(events) == {"kernels": 3, "memcpy": 2, "memset": 1}


def test_the_router_and_norm_flags_reach_the_model_and_the_report(tmp_path):
    code = main(["tune", "step", "--dims", "tiny", "--device", "cpu", "--reps", "2", "--warmup", "1", "--no-progress",
                 "--step-batches", "1", "--step-prefill", "4", "--router", "reference", "--norm", "reference",
                 "--report-dir", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "step.json").read_text())
    assert (report["router"], report["norm"]) == ("reference", "reference")
    assert report["rows"][0]["paths"]["router"] == "reference" and report["rows"][0]["paths"]["add_rms_norm"] == "reference"


def test_an_unknown_or_unavailable_path_is_refused_naming_the_choices(tmp_path, capsys):
    code = main(["tune", "step", "--dims", "tiny", "--device", "cpu", "--router", "nope", "--no-progress",
                 "--report-dir", str(tmp_path)])
    assert code == 2 and "no router 'nope'; registered: reference, topk_softmax, triton_fused" in capsys.readouterr().err
    # the fused router compiles for CUDA: on a CPU (no interpreter) it is refused with the reason, before any work
    code = main(["tune", "step", "--dims", "tiny", "--device", "cpu", "--router", "triton_fused", "--no-progress",
                 "--report-dir", str(tmp_path)])
    assert code == 2 and "triton_fused" in capsys.readouterr().err and not (tmp_path / "step.json").exists()


def _settings(graphs: bool) -> Settings:
    return Settings(torch.device("cpu"), torch.float32, 2, 1, graphs, L2Flusher(torch.device("cpu")))


def test_a_batch_whose_step_cannot_be_captured_is_skipped_with_the_reason(monkeypatch, tmp_path):
    """Capture refused (here: a CPU made to look graph-capable, so CapturableDecodeStep.capture refuses it): the
    batch keeps its eager results, the graph column says skipped, and the reason reaches the table and report."""
    monkeypatch.setattr(step_graph, "graphs_supported", lambda device: True)
    model = tiny_rank_model()
    ids, cache = prefilled(model)
    result = measure_static_step(model, cache, ids, model.forward(ids, cache)[0], _settings(True), lambda _: None)
    assert result.status == "skipped" and result.replay is None and result.static_eager is not None
    assert result.detail.startswith("capture failed: ValueError: CUDA graphs need a CUDA device"), result.detail
    assert result.eager_reproducible  # the eager check steps ran before the capture was tried
    row = _ok_row(2, result)
    meta = _meta()
    table = format_step_table(meta, [row])
    assert f"graph B=2: skipped: {result.detail}" in table and "skipped (see below)" in table
    write_step_report(tmp_path, meta, [row])
    md = (tmp_path / "step.md").read_text()
    assert result.detail in md and json.loads((tmp_path / "step.json").read_text())["rows"][0]["graph"]["status"] == \
        "skipped"


def test_the_graph_columns_show_the_replay_beside_eager_and_flag_a_replay_that_differs(tmp_path):
    equal = GraphResult("ok", max_len=11, static_eager=Timing(1200.0, 1100.0, 1300.0, 5),
                        replay=Timing(500.0, 450.0, 550.0, 5), static_vs_dynamic=3e-7, replay_equals_eager=True,
                        replay_max_abs_diff=0.0, eager_reproducible=True)
    differs = GraphResult("ok", max_len=11, static_eager=Timing(1200.0, 1100.0, 1300.0, 5),
                          replay=Timing(400.0, 390.0, 410.0, 5), static_vs_dynamic=3e-7, replay_equals_eager=False,
                          replay_max_abs_diff=0.125, eager_reproducible=False)
    off = GraphResult("off (--no-graph)")
    rows = [_ok_row(1, equal), _ok_row(8, differs), _ok_row(64, off)]
    meta = _meta()
    table = format_step_table(meta, rows)
    lines = table.splitlines()
    assert lines[1].split()[:5] == ["B", "eager", "ms", "(IQR/med)", "graph"]
    one = next(line for line in lines if line.strip().startswith("1 "))
    assert "0.50 (20%)" in one and "2,000" in one  # graph ms, and 1 / 500 us = 2,000 tokens/s
    assert "graph B=8: the replay's logits differ from the eager static step's (max abs diff 0.125; eager " \
           "reproducible: no)" in table
    assert "graph B=1" not in table and "off (--no-graph)" in table
    write_step_report(tmp_path, meta, rows)
    md = (tmp_path / "step.md").read_text()
    assert "| 1 | ok | 11 | 1.20 (17%) | 0.50 (20%) | 833 | 2,000 | yes | yes | 3.00e-07 | - |" in md
    assert "| 8 | ok | 11 | 1.20 (17%) | 0.40 (5%) | 6,667 | 20,000 | no (max abs diff 0.125) | no | 3.00e-07 | - |" \
        in md
    assert "| 64 | off (--no-graph) | - | - | - | - | - | - | - | - | - |" in md
    payload = json.loads((tmp_path / "step.json").read_text())
    assert payload["rows"][0]["graph"]["replay_tokens_per_s"] == pytest.approx(2000.0)
    assert payload["graph_findings"] and payload["graph_method"]


def _meta() -> dict:
    cfg = rank_config(Qwen36Config.from_hf_dict(TINY_MODEL), 4)
    return {"device": "cpu", "date": "2026-01-01", "command": "qwen36 tune step", "torch": torch.__version__,
            "dtype": "float32", "dims": "tiny-tp4", "tp": 4, "prefill": 8, "reps": 5, "warmup": 1,
            "router": "topk_softmax", "norm": "fused", "rank_config": dict(vars(cfg)), "timing": "eager",
            "graph_timing": "test", "ceilings": {"hbm_bytes_per_s": 1e12, "source": "test"}}


def _ok_row(batch: int, graph: GraphResult) -> StepRow:
    return StepRow(batch, 9, step=Timing(1000.0, 900.0, 1100.0, 5), instrumented_us=1100.0, graph=graph)


def test_a_capture_error_names_the_error_that_started_it():
    """A refused op inside a capture often surfaces as the capture's end failing, which names no cause."""
    try:
        try:
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture\ndetails")
        finally:
            raise RuntimeError("operation failed due to a previous error during capture")
    except RuntimeError as exc:
        why = step_graph._why(exc)
    assert why == ("RuntimeError: operation failed due to a previous error during capture (raised first: "
                   "RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA graph capture)")
    assert step_graph._why(ValueError("alone")) == "ValueError: alone"
