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
import inspect

from . import seams
from .registry import Patch
from .settings import NONSTREAM_TRAILING_CONTENT_ENV, PatchSettings

__all__ = ["PATCH", "uninstall"]

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
    for path in (f"{ENGINE}.{METHOD}", f"{ENGINE}._events_to_delta"):
        if (problem := seams.attribute_problem(path)) is not None:
            return problem
    if HELD_BACK not in inspect.getsource(seams.resolve(f"{ENGINE}._events_to_delta")):
        return f"ParserEngine._events_to_delta no longer holds text back in {HELD_BACK}"
    return None


def enabled(settings: PatchSettings) -> tuple[bool, str]:
    if not settings.nonstream_trailing_content:
        return False, f"{NONSTREAM_TRAILING_CONTENT_ENV}=1 turns it on"
    return True, ""


def install(settings: PatchSettings) -> str:
    seams.wrap_method(seams.resolve(ENGINE), METHOD, _wrap)
    return "text generated after a tool call stays in the non-stream answer's content, as streamed"


def uninstall() -> None:
    seams.unwrap_method(seams.resolve(ENGINE), METHOD)


PATCH = Patch(name="nonstream_trailing_content", seam=f"ParserEngine.{METHOD}", required=True,
              enabled=enabled, probe=probe, install=install)
