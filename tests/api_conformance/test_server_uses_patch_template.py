"""The embedded server renders prompts with the patch set's chat template: for every renderable message
case, the server's prompt_tokens equal the token count of our own rendering of the same conversation."""
from __future__ import annotations

import copy
import json

import pytest

from tests.api_conformance.message_corpus import MessageCase, renderable_cases
from tests.api_conformance.template_render import render_jinja
from tests.api_conformance.transport import send

pytestmark = pytest.mark.server

# Only conversations a client can send: one that ends in the assistant turn is a prefill, not a request.
CASES = [c for c in renderable_cases() if c.kwargs.get("add_generation_prompt")]


@pytest.fixture(scope="module")
def tokenizer(openai_server):
    if not openai_server.model_dir:
        pytest.skip("a live --server-url server: its tokenizer and template are not ours to compare with")
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(openai_server.model_dir)


def as_openai_request(messages: list) -> list:
    """Tool-call arguments as JSON strings, the form the OpenAI API (and vLLM's schema) takes."""
    out = copy.deepcopy(messages)
    for m in out:
        for tc in m.get("tool_calls") or []:
            if not isinstance(tc["function"].get("arguments"), str):
                tc["function"]["arguments"] = json.dumps(tc["function"]["arguments"])
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_server_prompt_tokens_equal_our_rendering_of_the_patch_template(case: MessageCase, openai_server,
                                                                          tokenizer) -> None:
    body = {"model": openai_server.model, "messages": as_openai_request(case.messages), "max_tokens": 1}
    if case.tools:
        body["tools"] = case.tools
    if "enable_thinking" in case.kwargs:
        body["chat_template_kwargs"] = {"enable_thinking": case.kwargs["enable_thinking"]}
    ex = send(openai_server, "chat", body, timeout_s=60)
    assert ex.status == 200, ex.text[:300]
    ours = render_jinja(case.messages, case.tools, **case.kwargs)
    assert ex.body["usage"]["prompt_tokens"] == len(tokenizer(ours, add_special_tokens=False)["input_ids"])
