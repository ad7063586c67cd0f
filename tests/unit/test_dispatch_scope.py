"""model.dispatch.scope: inside one forward pass each selector answers each question once; outside a scope, and in
the next pass, it asks again (so a table switched between passes takes effect)."""
from __future__ import annotations

import torch

import model.moe.block_paths as block_paths
from harness.tune.measure.inputs import rank_config, rank_weights
from harness.tune.step.run import TINY_MODEL
from model.dispatch.scope import one_dispatch_scope, scoped
from model.qwen36 import Qwen36Config, Qwen36Model


def _counting():
    calls = []

    @scoped
    def select(n, device=None):
        calls.append((n, device))
        return f"path-{n}"

    return select, calls


def test_outside_a_scope_every_call_asks():
    select, calls = _counting()
    assert [select(1), select(1)] == ["path-1", "path-1"]
    assert len(calls) == 2


def test_inside_a_scope_each_distinct_question_is_asked_once_and_the_next_scope_asks_again():
    select, calls = _counting()
    with one_dispatch_scope():
        answers = [select(1), select(1), select(2), select(1, device="cpu"), select(1, device="cpu")]
        with one_dispatch_scope():  # nested: the outer scope's answers still hold
            answers.append(select(2))
    assert answers == ["path-1", "path-1", "path-2", "path-1", "path-1", "path-2"]
    assert calls == [(1, None), (2, None), (1, "cpu")]
    with one_dispatch_scope():
        select(1)
    assert calls[-1] == (1, None) and len(calls) == 4


def test_an_unhashable_argument_is_answered_without_a_memo():
    select, calls = _counting()
    with one_dispatch_scope():
        assert select([3]) == select([3]) == "path-[3]"
    assert len(calls) == 2


def test_a_forward_pass_asks_the_moe_block_selector_once_for_all_its_layers(monkeypatch):
    cfg = rank_config(Qwen36Config.from_hf_dict(TINY_MODEL), 4)
    model = Qwen36Model(rank_weights(cfg, torch.float32, torch.device("cpu")))
    asked = []
    real = block_paths.table_path_for

    def counting_table_path_for(block, *args, **kwargs):
        asked.append(block)
        return real(block, *args, **kwargs)

    monkeypatch.setattr(block_paths, "table_path_for", counting_table_path_for)
    ids = torch.zeros(2, 1, dtype=torch.int64)
    model.forward(ids)
    assert cfg.num_hidden_layers > 1 and asked == ["moe_block"]
    model.forward(ids)  # a new pass asks again
    assert asked == ["moe_block", "moe_block"]
