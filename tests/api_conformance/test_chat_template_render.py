"""The patch set's chat template over the message corpus: rendered by plain jinja2 and by transformers,
pinned by snapshots, with the structural promises checked directly and every refusal naming its message."""
from __future__ import annotations

import re

import pytest

from patches.api.request_compat import ToolCallArgumentsError, parse_tool_call_arguments
from tests.api_conformance.message_corpus import (
    MessageCase,
    refused_cases,
    renderable_cases,
    string_argument_pairs,
)
from tests.api_conformance.template_render import TemplateRefused, render_jinja, render_transformers

RENDERABLE = renderable_cases()
REFUSED = refused_cases()
SYSTEM_ROLES = ("system", "developer")


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p if isinstance(p, str) else p["text"] for p in content)


def _render(case: MessageCase) -> str:
    return render_jinja(case.messages, case.tools, **case.kwargs)


@pytest.mark.parametrize("case", RENDERABLE, ids=lambda c: c.name)
def test_jinja2_and_transformers_render_identically(case: MessageCase) -> None:
    assert render_transformers(case.messages, case.tools, **case.kwargs) == _render(case)


@pytest.mark.parametrize("case", RENDERABLE, ids=lambda c: c.name)
def test_rendered_prompt_matches_snapshot(case: MessageCase, template_snapshot) -> None:
    assert _render(case) == template_snapshot


@pytest.mark.parametrize("case", RENDERABLE, ids=lambda c: c.name)
def test_system_messages_merge_in_order_into_one_leading_block(case: MessageCase) -> None:
    out = _render(case)
    systems = [_text(m["content"]).strip() for m in case.messages if m["role"] in SYSTEM_ROLES]
    if not systems and not case.tools:
        assert "<|im_start|>system" not in out
        return
    assert out.startswith("<|im_start|>system\n")
    assert out.count("<|im_start|>system") == 1
    block = out.split("<|im_end|>", 1)[0]
    positions = [block.find(s) for s in systems]
    assert -1 not in positions, f"a system text is missing from the system block: {systems}"
    assert positions == sorted(positions), "system texts are not in message order"


@pytest.mark.parametrize("case", RENDERABLE, ids=lambda c: c.name)
def test_every_turn_tool_call_and_tool_result_is_rendered(case: MessageCase) -> None:
    out = _render(case)
    for m in case.messages:
        if m["role"] == "user":
            assert f"<|im_start|>user\n{_text(m['content'])}<|im_end|>" in out
    names = [tc["function"]["name"] for m in case.messages for tc in (m.get("tool_calls") or [])]
    conversation = out.split("<|im_end|>", 1)[1] if out.startswith("<|im_start|>system") else out
    assert re.findall(r"<function=([^>\n]+)>\n", conversation) == names
    tool_results = [_text(m["content"]) for m in case.messages if m["role"] == "tool"]
    assert re.findall(r"<tool_response>\n(.*?)\n</tool_response>", out, re.S) == tool_results


@pytest.mark.parametrize("case", [c for c in RENDERABLE if c.kwargs.get("add_generation_prompt")],
                         ids=lambda c: c.name)
def test_generation_prompt_opens_or_closes_thinking(case: MessageCase) -> None:
    out = _render(case)
    if case.kwargs.get("enable_thinking", True):
        assert out.endswith("<|im_start|>assistant\n<think>\n")
    else:
        assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_reasoning_is_kept_only_after_the_last_user_query() -> None:
    case = next(c for c in RENDERABLE if c.name == "reasoning_kept_after_last_query_dropped_before")
    out = _render(case)
    assert "old thoughts" not in out
    assert "<think>\nnew thoughts\n</think>\n\nA2" in out


@pytest.mark.parametrize("render", [render_jinja, render_transformers], ids=["jinja2", "transformers"])
@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.name)
def test_unrenderable_message_is_refused_naming_index_role_and_reason(case: MessageCase, render) -> None:
    with pytest.raises(TemplateRefused) as info:
        render(case.messages, case.tools, **case.kwargs)
    text = str(info.value)
    assert f"message {case.error['index']} (role '{case.error['role']}')" in text
    assert case.error["reason"] in text


@pytest.mark.parametrize("pair", string_argument_pairs(), ids=lambda p: "string_vs_object_arguments")
def test_string_arguments_after_request_compat_render_like_object_arguments(pair) -> None:
    string_form, object_form = pair
    assert render_jinja(parse_tool_call_arguments(string_form)) == render_jinja(object_form)


def test_request_compat_leaves_its_input_unchanged() -> None:
    string_form, _ = string_argument_pairs()[0]
    before = repr(string_form)
    parse_tool_call_arguments(string_form)
    assert repr(string_form) == before


@pytest.mark.parametrize("bad, why", [("{not json", "not valid JSON"), ("[1, 2]", "not a JSON object")])
def test_request_compat_refuses_bad_argument_strings_naming_the_message(bad: str, why: str) -> None:
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": bad}}]},
    ]
    with pytest.raises(ToolCallArgumentsError, match=rf"message 1 \(assistant\): tool_calls\[0\] \(f\).*{why}"):
        parse_tool_call_arguments(messages)
