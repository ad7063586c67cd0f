"""What the template writes for an assistant's tool calls, vLLM's `qwen3_coder` tool parser reads back:
the same function names, in order, and the same arguments (typed by the tools' schemas)."""
from __future__ import annotations

import json
import re

import pytest

from tests.api_conformance.message_corpus import corpus_tools, renderable_cases
from tests.api_conformance.template_render import render_jinja

pytest.importorskip("vllm")

CASES = [c for c in renderable_cases() if any(m.get("tool_calls") for m in c.messages)]


@pytest.fixture(scope="module")
def tool_parser():
    from harness.serving.tiny_model import TinyRecipe, train_tokenizer
    from transformers import PreTrainedTokenizerFast
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.qwen3_engine_tool_parser import Qwen3EngineToolParser

    # The tiny model's tokenizer: the parser looks <tool_call> up as one special token.
    recipe = TinyRecipe.load()
    tok = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(recipe.seed, recipe.vocab_size))
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=corpus_tools())

    def parse(text: str):
        return Qwen3EngineToolParser(tok, request.tools).extract_tool_calls(text, request)

    return parse


def _assistant_turns(rendered: str) -> list[str]:
    return re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", rendered, re.S)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_vllm_qwen3_coder_parser_reads_back_rendered_tool_calls(case, tool_parser) -> None:
    rendered = render_jinja(case.messages, case.tools, **{**case.kwargs, "add_generation_prompt": False})
    turns = iter(_assistant_turns(rendered))
    for m in case.messages:
        if m["role"] != "assistant":
            continue
        turn = next(turns)
        calls = m.get("tool_calls") or []
        if not calls:
            continue
        info = tool_parser(turn)
        assert info.tools_called
        assert [c.function.name for c in info.tool_calls] == [c["function"]["name"] for c in calls]
        expected = [c["function"]["arguments"] or {} for c in calls]
        assert [json.loads(c.function.arguments) for c in info.tool_calls] == expected
