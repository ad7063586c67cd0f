"""Evidence for the deviation reasoning-parser-swallows-forced-tool-calls: it is the tiny random model, not vLLM.

With thinking on, the prompt ends inside `<think>`; vLLM applies the forced-call grammar (tool_choice
"required" or named) from the end of the reasoning, and the reasoning parser hands everything after
`</think>` to the tool parser. The tiny random model never writes `</think>` within max_tokens, so its answers
end (finish_reason length) inside the reasoning with no call. A model that closes its reasoning gets the call:
shown on vLLM's own parser with an output that closes `</think>` (no server), and on the server by making the
tiny model write `</think>` first (`logit_bias` on that token), after which the grammar produces a call to a
tool of the request. So the deviation is narrowed to `tiny-*` targets and nothing is patched: a client that
forces a tool with thinking on gets the call after the model's reasoning, as from OpenAI's reasoning models,
or finish_reason length when the reasoning uses up max_tokens.
"""
from __future__ import annotations

import httpx
import pytest

from tests.api_conformance import assemble
from tests.api_conformance.corpus import case
from tests.api_conformance.transport import send

FORCED = ("chat_tool_choice_required_nonstream_thinking_on", "chat_tool_choice_named_nonstream_thinking_on",
          "chat_tool_choice_required_stream_thinking_on")
REASONED_CALL = ["The user wants the time", ".", "</think>", "\n\n", "<tool_call>", "\n", "<function=get_time>",
                 "\n", "<parameter=zone>", "\nAsia/Tokyo\n", "</parameter>", "\n", "</function>", "\n",
                 "</tool_call>"]


@pytest.mark.parametrize("mode", ["nonstream", "stream"])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_vllm_parser_returns_the_forced_call_after_closed_reasoning(mode, choice):
    pytest.importorskip("vllm")
    from tests.api_conformance import vllm_parser as vp

    tool_choice = vp.REQUIRED if choice == "required" else vp.NAMED
    answer = (vp.stream if mode == "stream" else vp.nonstream)(REASONED_CALL, tool_choice, thinking=True)
    assert answer.calls == [("get_time", '{"zone": "Asia/Tokyo"}')]
    assert answer.reasoning.startswith("The user wants the time") and answer.content == ""
    # The tiny model's case: reasoning that never closes holds no call.
    unclosed = (vp.stream if mode == "stream" else vp.nonstream)(REASONED_CALL[:2], tool_choice, thinking=True)
    assert unclosed.calls == [] and unclosed.reasoning


def _think_end_token(server) -> int:
    """The served tokenizer's id of `</think>` (vLLM's /tokenize), so the test fits any Qwen3 target."""
    r = httpx.post(f"{server.base_url}/tokenize", timeout=30,
                   headers={"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}, json={"model": server.model, "prompt": "</think>", "add_special_tokens": False})
    tokens = r.json().get("tokens") if r.status_code == 200 else None
    if not tokens or len(tokens) != 1:
        pytest.skip(f"the server's tokenizer has no single </think> token (/tokenize: {r.status_code} {r.text[:100]})")
    return tokens[0]


@pytest.mark.server
@pytest.mark.parametrize("name", FORCED)
def test_a_model_made_to_close_its_reasoning_gets_the_forced_call(name, openai_server):
    c = case(name)
    body = c.request_body(openai_server.model)
    # The first token closes the reasoning; after it the forced-call grammar masks `</think>` out.
    body["logit_bias"] = {str(_think_end_token(openai_server)): 100}
    ex = send(openai_server, "chat", body, timeout_s=c.timeout_s)
    assert ex.status == 200, ex.text[:300]
    [view] = assemble.choices(ex).values()
    tools = {t["function"]["name"] for t in body["tools"]}
    assert view.tool_calls and all(tc.name in tools for tc in view.tool_calls), view
    if "named" in name:
        assert {tc.name for tc in view.tool_calls} == {"get_weather"}
