"""Datasets are deterministic from a seed and have the shapes the issue asks for."""
from __future__ import annotations

import json

import pytest

from harness.bench import datasets as ds
from harness.errors import HarnessError


def test_every_dataset_is_deterministic_from_its_seed():
    for make in (ds.official_like, ds.decode_micro, lambda seed: ds.matrix_point(seed, 64, 16, 4)):
        assert make(seed=3).digest == make(seed=3).digest
        assert make(seed=3).digest != make(seed=4).digest


def test_official_like_has_29_schema_tools_and_a_shared_system_prefix():
    d = ds.official_like(seed=0)
    tools = d.items[0].body["tools"]
    assert len(tools) == 29 and len({t["function"]["name"] for t in tools}) == 29
    for t in tools:
        params = t["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
    systems = {i.body["messages"][0]["content"] for i in d.items}
    assert len(systems) == 1


def test_official_like_sessions_are_cumulative_with_tool_calls_and_results():
    d = ds.official_like(seed=0, sessions=2, turns=3)
    by_session: dict[int, list] = {}
    for item in d.items:
        by_session.setdefault(item.tags["session"], []).append(item.body["messages"])
    for turns in by_session.values():
        for prev, cur in zip(turns, turns[1:]):
            assert cur[: len(prev)] == prev  # the next turn resends the whole history: a reusable prefix
            added = cur[len(prev):]
            assert [m["role"] for m in added] == ["assistant", "tool", "user"]
            assert added[0]["content"] is None and json.loads(added[0]["tool_calls"][0]["function"]["arguments"]) is not None


def test_official_like_respects_the_prompt_cap_by_the_given_tokenizer():
    count = ds.approx_token_count
    d = ds.official_like(seed=0, sessions=2, turns=10, prompt_cap_tokens=5000, count=count)
    assert all(i.tags["est_prompt_tokens"] <= 5000 for i in d.items)
    assert max(i.tags["turn"] for i in d.items) < 9  # the cap ended sessions early
    with pytest.raises(HarnessError, match="prompt_cap_tokens=10"):
        ds.official_like(seed=0, prompt_cap_tokens=10, count=count)


def test_decode_micro_forces_exact_output_length():
    d = ds.decode_micro(seed=0, requests=5, output_tokens=33)
    assert len(d.items) == 5 and d.warmup
    for item in d.items:
        b = item.body
        assert b["max_tokens"] == b["min_tokens"] == 33 and b["ignore_eos"] is True


def test_matrix_point_prompt_has_exact_token_count():
    d = ds.matrix_point(0, input_tokens=77, output_tokens=9, requests=3)
    assert [len(i.body["prompt"]) for i in d.items] == [77, 77, 77]
    assert d.name == "matrix-i77-o9"


def test_replay_reads_bodies_and_wrapped_lines_and_names_a_bad_line(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n\n"
                 + json.dumps({"body": {"prompt": "b"}, "tags": {"k": 1}}) + "\n")
    d = ds.replay(f)
    assert [i.tags for i in d.items] == [{"line": 1}, {"k": 1, "line": 3}]
    f.write_text('{"messages": []}\n{not json\n')
    with pytest.raises(HarnessError, match="line 2"):
        ds.replay(f)
