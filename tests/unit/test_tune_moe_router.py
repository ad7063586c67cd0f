"""harness.tune.blocks.moe.sweep_moe_router on the CPU at tiny dims: every router that runs here is timed and checked
against route_reference, and a wrong one is reported `wrong`, never timed as if right."""
from __future__ import annotations

from unittest.mock import patch

import torch

from harness.tune.blocks.moe import sweep_moe_router
from harness.tune.measure import dims as D
from harness.tune.measure.point import Settings
from harness.tune.measure.timing import L2Flusher
from model.moe import ROUTERS, RouterPath, route_reference, route_topk_softmax

CPU = torch.device("cpu")
SETTINGS = Settings(CPU, torch.float32, reps=3, warmup=0, graphs=False, flusher=L2Flusher(CPU))
TOKENS = (1, 5)


def route_lowest_logits(logits, top_k):
    """Right weights for the wrong experts: the k smallest logits."""
    weights, ids = route_topk_softmax(-logits, top_k)
    return torch.softmax(logits.float().gather(-1, ids), dim=-1), ids


def route_not_renormalised(logits, top_k):
    """The right experts with their full-softmax probabilities."""
    _, ids = route_reference(logits, top_k)
    return torch.softmax(logits.float(), dim=-1).gather(-1, ids), ids


def test_the_router_sweep_times_and_checks_every_router_that_runs_here():
    ticks = []
    rows = sweep_moe_router(D.TINY.moe, TOKENS, SETTINGS, ticks.append)
    here = [p.name for p in ROUTERS.candidates() if p.supports(1, torch.float32, CPU)]
    assert "topk_softmax" in here and "reference" not in here
    assert [(r.key, r.path) for r in rows] == [(t, name) for t in TOKENS for name in here]
    for r in rows:
        assert r.block == "moe_router" and r.status == "ok", (r.path, r.key, r.status, r.detail)
        assert r.eager is not None and r.eager.median_us > 0
        assert r.err_eager <= r.bound
    assert ticks == [f"moe router T={t}" for t in TOKENS]


def test_a_wrong_router_is_reported_wrong_and_not_timed():
    wrong = {name: RouterPath(name, fn) for name, fn in
             (("wrong_ids", route_lowest_logits), ("not_renormalised", route_not_renormalised))}
    with patch.dict(ROUTERS, wrong):
        rows = sweep_moe_router(D.TINY.moe, (4,), SETTINGS, lambda _: None)
    by_path = {r.path: r for r in rows}
    assert by_path["wrong_ids"].status == "wrong" and "ids differ" in by_path["wrong_ids"].detail
    assert by_path["not_renormalised"].status == "wrong", by_path["not_renormalised"].detail
    assert by_path["wrong_ids"].eager is None and by_path["not_renormalised"].eager is None
    assert by_path["topk_softmax"].status == "ok"
