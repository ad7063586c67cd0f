"""A streamed forced tool call sends no `<tool_call>` marker as content (deviation
stream-leaks-tool-call-marker-into-content).

With `tool_choice` "required" or a named function, vLLM constrains the output to a tool call (an xgrammar
structural tag that begins with the text `<tool_call>`). The grammar accepts that opener either as the
special token or spelled out in ordinary tokens (`<`, `tool`, `_call`, `>`); the tiny random model here picks
the spelled form. vLLM's streaming parser engine, once it has seen token ids, treats a spelled-out marker as
plain text on purpose (`StreamingParserEngine._process_lex_tokens`: terminals listed in `token_id_terminals`
only count as the special token), so the stream sends "<tool_call>\\n" as content before the call, while the
non-stream parse of the same text (no token ids) reads it as the opener and returns content "". Under a
forced tool choice the grammar admits nothing but a call there, so the spelled marker is the opener: the
patch lets the tool-call terminals (`TOOL_START`, `TOOL_END`) match in their spelled form for forced
requests, and stream and non-stream agree. `tool_choice` auto and none keep vLLM's rule (text there may be
prose about tags).

Seam (vLLM 0.32): `ParserEngine.extract_tool_calls_streaming` (parser/engine/parser_engine.py) is wrapped;
it narrows the instance's `StreamingParserEngine._token_id_terminal_names`, the set
`_process_lex_tokens` treats as special-token-only.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

from ..core import seams

__all__ = ["PATCH", "forced_tool_choice"]

ENGINE = "vllm.parser.engine.parser_engine:ParserEngine"
STREAMING_ENGINE = "vllm.parser.engine.streaming_parser_engine:StreamingParserEngine"
NAMED_CHOICE = "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionNamedToolChoiceParam"
METHOD = "extract_tool_calls_streaming"
METHOD_PARAMS = ("self", "previous_text", "current_text", "delta_text", "previous_token_ids",
                 "current_token_ids", "delta_token_ids", "request")
STRICT_SET = "_token_id_terminal_names"
MARKERS = frozenset({"TOOL_START", "TOOL_END"})


def forced_tool_choice(request: Any) -> bool:
    choice = getattr(request, "tool_choice", None)
    return choice == "required" or isinstance(choice, seams.resolve(NAMED_CHOICE))


def _wrap(original):
    @functools.wraps(original)
    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, previous_token_ids,
                                     current_token_ids, delta_token_ids, request):
        engine = getattr(self, "_engine", None)
        strict = getattr(engine, STRICT_SET, None)
        if forced_tool_choice(request) and isinstance(strict, frozenset) and strict & MARKERS:
            setattr(engine, STRICT_SET, strict - MARKERS)  # this request's parser instance only
        return original(self, previous_text, current_text, delta_text, previous_token_ids,
                        current_token_ids, delta_token_ids, request)

    return extract_tool_calls_streaming


def probe() -> str | None:
    if (problem := seams.first_problem(f"{ENGINE}.{METHOD}", f"{STREAMING_ENGINE}._process_lex_tokens",
                                       NAMED_CHOICE)) is not None:
        return problem
    method = getattr(seams.resolve(ENGINE), METHOD)
    params = tuple(inspect.signature(getattr(method, "__wrapped__", method)).parameters)
    if params != METHOD_PARAMS:
        return f"ParserEngine.{METHOD}{params} differs from the expected {METHOD_PARAMS}"
    return seams.source_problem(f"{STREAMING_ENGINE}._process_lex_tokens", STRICT_SET)


PATCH = seams.api_patch(
    "stream_tool_marker", "QWEN36_PATCH_STREAM_TOOL_MARKER", f"ParserEngine.{METHOD}", probe,
    (seams.WrappedMethod(ENGINE, METHOD, _wrap),),
    "forced tool_choice: a spelled-out <tool_call> / </tool_call> in a stream opens / closes the call")
