"""The sweeps of the decode step's attention layer and residual add + RMSNorm
(harness/tune/blocks/attention_and_norm.py), on a CPU at tiny dims: a correct path passes, and a path that writes
the KV cache wrong, or returns a wrong sum or norm, is marked wrong with the reason, however close its output is."""
from __future__ import annotations

from dataclasses import replace
from unittest import mock

import pytest
import torch

from harness.tune.blocks.attention_and_norm import sweep_add_rms_norm, sweep_attention_layer
from harness.tune.measure import dims as D
from harness.tune.measure.point import Settings
from harness.tune.measure.timing import L2Flusher
from model.attention.decode_layer import ATTENTION_DECODE_LAYER_PATHS
from model.norm.rms_norm import ADD_RMS_NORM_PATHS

CPU = torch.device("cpu")
S = Settings(CPU, torch.float32, reps=1, warmup=0, graphs=False, flusher=L2Flusher(CPU, 0))
CONTEXT = 6


def _ceilings():
    from harness.tune.measure.ceilings import ceilings_for

    return ceilings_for("cpu", None, None)


STAGED = ATTENTION_DECODE_LAYER_PATHS["staged"].fn
FUSED_ADD_NORM = ADD_RMS_NORM_PATHS["fused"].fn


def staged(x, w, cache):
    return STAGED(x, w, cache)


def writes_one_past(x, w, cache):
    """Right output, and the key and value stored one position past the length as well (a stale slot changed)."""
    y = staged(x, w, cache)
    at = int(cache.length)
    cache.k[:, :, at + 1] = cache.k[:, :, at]
    return y


def forgets_the_value(x, w, cache):
    """Right output, but the value at the length left as it was."""
    before = cache.v[:, :, int(cache.length)].clone()
    y = staged(x, w, cache)
    cache.v[:, :, int(cache.length)] = before
    return y


def sweep_attention(fn):
    path = replace(ATTENTION_DECODE_LAYER_PATHS["staged"], fn=fn)
    with mock.patch.dict(ATTENTION_DECODE_LAYER_PATHS, {"staged": path}):
        rows = sweep_attention_layer(D.TINY.attention, [1, 3], CONTEXT, S, _ceilings(), lambda _: None,
                                     paths_at=lambda block, key: {"staged"})
    return {r.key: r for r in rows}


def test_the_staged_attention_passes_at_each_batch():
    rows = sweep_attention(staged)
    assert {k: r.status for k, r in rows.items()} == {1: "ok", 3: "ok"}
    assert all(r.err_eager <= r.bound and r.extra["context"] == CONTEXT for r in rows.values())


@pytest.mark.parametrize("broken, why", [(writes_one_past, "other than its length"),
                                         (forgets_the_value, "wrote the key and value")])
def test_a_path_that_writes_the_cache_wrong_is_marked_wrong(broken, why):
    rows = sweep_attention(broken)
    assert all(r.status == "wrong" and why in r.detail for r in rows.values()), {k: r.detail for k, r in rows.items()}


def test_the_add_norm_paths_pass_and_a_wrong_sum_is_caught():
    def sum_not_rounded_back(h, y, weight, eps):  # returns h instead of h + y: the norm is right, the sum is not
        _, normed = FUSED_ADD_NORM(h, y, weight, eps)
        return h.clone(), normed

    rows = sweep_add_rms_norm(D.TINY.attention.hidden_size, 1e-6, [1, 4], S, _ceilings(), lambda _: None,
                              paths_at=lambda block, key: {"fused"})
    assert {(r.key, r.path): r.status for r in rows} == {(1, "fused"): "ok", (4, "fused"): "ok"}
    broken = replace(ADD_RMS_NORM_PATHS["fused"], fn=sum_not_rounded_back)
    with mock.patch.dict(ADD_RMS_NORM_PATHS, {"fused": broken}):
        rows = sweep_add_rms_norm(D.TINY.attention.hidden_size, 1e-6, [4], S, _ceilings(), lambda _: None,
                                  paths_at=lambda block, key: {"fused"})
    assert [r.status for r in rows] == ["wrong"]


def test_vllms_own_norm_is_a_checked_candidate_and_a_wrong_one_is_caught():
    pytest.importorskip("vllm", reason="vLLM's own layer is a candidate only where vLLM imports")
    from harness.tune.blocks import vllm_own

    rows = sweep_add_rms_norm(D.TINY.attention.hidden_size, 1e-6, [1, 4], S, _ceilings(), lambda _: None)
    assert {(r.key, r.path): r.status for r in rows} == {
        (1, "fused"): "ok", (4, "fused"): "ok", (1, "vllm"): "ok", (4, "vllm"): "ok"}
    real = vllm_own.add_rms_norm

    def norm_of_h_alone(hidden, eps, weight):  # vLLM's layer handed the residual only: the sum is missing
        fn = real(hidden, eps, weight)
        return lambda h, y: fn(h, torch.zeros_like(y))

    with mock.patch.object(vllm_own, "add_rms_norm", norm_of_h_alone):
        rows = sweep_add_rms_norm(D.TINY.attention.hidden_size, 1e-6, [4], S, _ceilings(), lambda _: None,
                                  paths_at=lambda block, key: {"vllm"})
    assert [(r.path, r.status) for r in rows] == [("vllm", "wrong")]
