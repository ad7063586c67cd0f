"""A non-stream answer keeps the text generated after a tool call, as the stream does (deviation
nonstream-drops-content-after-tool-call).

vLLM 0.32's parser engine holds back text that follows a tool event in the same batch of output
(`ParserEngine._events_to_delta` moves it to `_deferred_content`) and releases it with the next batch that has
no tool-call delta. A stream always has a next batch, so the text after `</tool_call>` reaches the client as
content; the non-stream parse is one batch (`_single_pass_parse`), so that text is never released and the
answer silently loses it. Found once `stream_tool_marker` let the tiny model's spelled-out `</tool_call>` close
its call: the stream then carried the text after it, the non-stream answer dropped it. Generated text is not
dropped here: the patch appends what is still held back after the single pass to the answer's content, which
is what the stream sent.

Seam (vLLM 0.32): `ParserEngine._single_pass_parse` (parser/engine/parser_engine.py) is wrapped; it reads the
engine's `_deferred_content` after the pass.
"""
from __future__ import annotations

import functools

from ..core import seams

__all__ = ["PATCH"]

ENGINE = "vllm.parser.engine.parser_engine:ParserEngine"
METHOD = "_single_pass_parse"
HELD_BACK = "_deferred_content"


def _wrap(original):
    @functools.wraps(original)
    def _single_pass_parse(self, *args, **kwargs):
        reasoning, content, info = original(self, *args, **kwargs)
        held = getattr(self, HELD_BACK, "")
        if held and info.tools_called:
            setattr(self, HELD_BACK, "")
            content = (content or "") + held  # after the call, where the stream sends it
        return reasoning, content, info

    return _single_pass_parse


def probe() -> str | None:
    return (seams.first_problem(f"{ENGINE}.{METHOD}", f"{ENGINE}._events_to_delta")
            or seams.source_problem(f"{ENGINE}._events_to_delta", HELD_BACK))  # where it holds text back


PATCH = seams.api_patch(
    "nonstream_trailing_content", "QWEN36_PATCH_NONSTREAM_TRAILING_CONTENT", f"ParserEngine.{METHOD}", probe,
    (seams.WrappedMethod(ENGINE, METHOD, _wrap),),
    "text generated after a tool call stays in the non-stream answer's content, as streamed")
