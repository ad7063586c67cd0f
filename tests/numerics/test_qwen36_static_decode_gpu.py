"""The static decode step captured in a CUDA graph: replays give the eager static step's logits bit for bit.

The replays run at successive lengths from one capture (each advances the device-side length), so this is also
the check that one graph serves every length below max_len. Paths the dispatch serves that read the device on
the host (the MoE `sorted` and `reference` paths) must refuse the capture cleanly, leaving the cache as it was;
`qwen36 tune step` then reports the batch as skipped. Tiny dims in float32 and bfloat16 (the H200's dispatch
table applies to bfloat16), and the real per-rank dims (TP=4) in bfloat16.
"""
from __future__ import annotations

import pytest
import torch

from harness.tune.measure.inputs import rank_config, rank_weights
from harness.tune.measure.point import Settings
from harness.tune.measure.timing import L2Flusher
from harness.tune.step.graph import measure_static_step
from harness.tune.step.run import QWEN36_35B_A3B, TINY_MODEL
from model.dispatch.table import TABLE_ENV
from model.moe import MoEConfig, select_expert_path
from model.qwen36 import CapturableDecodeStep, Qwen36Config, Qwen36Model, Qwen36Paths
from model.qwen36.static_step import greedy_logits

pytestmark = pytest.mark.gpu
DEVICE = torch.device("cuda")
PREFILL = 16
STEPS = 3
HOST_READING_MOE_PATHS = ("sorted", "reference")  # counts.tolist() / unique().tolist()


def build(config: dict, tp: int, dtype: torch.dtype, paths: Qwen36Paths | None = None) -> Qwen36Model:
    return Qwen36Model(rank_weights(rank_config(Qwen36Config.from_hf_dict(config), tp), dtype, DEVICE, seed=3), paths)


def prefilled_step(model: Qwen36Model, batch: int) -> tuple[CapturableDecodeStep, torch.Tensor]:
    gen = torch.Generator(device=DEVICE).manual_seed(batch)
    ids = torch.randint(0, model.config.vocab_size, (batch, PREFILL), generator=gen, device=DEVICE)
    logits, cache = model.forward(ids)
    return CapturableDecodeStep.from_prefill(model, cache, PREFILL + STEPS + 2), logits[:, -1:].argmax(-1)


def check_replay(model: Qwen36Model, batch: int) -> None:
    """Capture the step; replays must equal eager static steps bit for bit. A refused capture passes only where
    the MoE expert path the dispatch serves reads the device on the host, and must leave the cache as it was."""
    step, first = prefilled_step(model, batch)
    saved = step.snapshot()
    eager = greedy_logits(step.run, first, STEPS)
    step.restore(saved)
    try:
        step.capture()
    except Exception as exc:
        served = select_expert_path(batch, model.paths.moe, DEVICE, model.weights.embed.dtype)
        assert served in HOST_READING_MOE_PATHS, f"B={batch}: capture refused with expert path {served}: {exc!r}"
        after = step.snapshot()
        assert after.position == saved.position
        assert all(torch.equal(a, b) for a, b in zip(saved.buffers, after.buffers)), "a refused capture moved the cache"
        return
    replayed = greedy_logits(step.replay, first, STEPS)
    for i, (e, r) in enumerate(zip(eager, replayed)):
        assert torch.equal(e, r), f"B={batch}, step {i}: replay differs by {(e - r).abs().max().item()}"
    assert int(step.cache.length) == PREFILL + STEPS


@pytest.mark.parametrize(("dtype", "batch"), [(torch.float32, 1), (torch.float32, 4), (torch.float32, 8),
                                               (torch.bfloat16, 1), (torch.bfloat16, 8), (torch.bfloat16, 64)])
def test_replay_equals_the_eager_static_step_at_tiny_dims(dtype, batch):
    check_replay(build(TINY_MODEL, 1, dtype), batch)


@pytest.fixture(scope="module")
def real_model() -> Qwen36Model:
    return build(QWEN36_35B_A3B, 4, torch.bfloat16)  # one rank of TP=4: about 17 GB of bf16 weights


@pytest.mark.parametrize("batch", (1, 64))
def test_replay_equals_the_eager_static_step_at_the_real_dims(real_model, batch):
    check_replay(real_model, batch)


def test_a_path_that_reads_the_device_is_refused_and_the_step_reports_it(monkeypatch):
    """The `sorted` MoE path forced: capture raises and leaves the cache; `tune step` marks the batch skipped."""
    monkeypatch.setenv(TABLE_ENV, "off")
    model = build(TINY_MODEL, 1, torch.float32, Qwen36Paths(moe=MoEConfig(decode_native=False, tiny_max=0)))
    assert select_expert_path(2, model.paths.moe, DEVICE, torch.float32) == "sorted"
    step, _ = prefilled_step(model, 2)
    saved = step.snapshot()
    with pytest.raises(Exception):
        step.capture()
    after = step.snapshot()
    assert after.position == saved.position and all(torch.equal(a, b) for a, b in zip(saved.buffers, after.buffers))
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    logits, cache = model.forward(torch.randint(0, model.config.vocab_size, (2, PREFILL), generator=gen, device=DEVICE))
    ids = logits[:, -1:].argmax(-1)
    s = Settings(DEVICE, torch.float32, 3, 1, True, L2Flusher(DEVICE))
    result = measure_static_step(model, cache, ids, model.forward(ids, cache)[0], s, lambda _: None)
    assert result.status == "skipped" and "capture failed" in result.detail, result
    assert result.static_eager is not None and result.replay is None


def test_tune_steps_graph_column_times_a_replay_that_equals_the_eager_static_step():
    model = build(TINY_MODEL, 1, torch.bfloat16)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    logits, cache = model.forward(torch.randint(0, model.config.vocab_size, (1, PREFILL), generator=gen, device=DEVICE))
    ids = logits[:, -1:].argmax(-1)
    s = Settings(DEVICE, torch.bfloat16, 5, 2, True, L2Flusher(DEVICE))
    result = measure_static_step(model, cache, ids, model.forward(ids, cache)[0], s, lambda _: None)
    assert result.status == "ok", result.detail
    assert result.replay_equals_eager and result.eager_reproducible
    assert result.replay.samples == 5 and result.replay.median_us > 0 and result.static_eager.samples == 5
