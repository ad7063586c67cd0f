"""A tool call cut before its end keeps its truncated arguments text, streamed or not (deviation
truncated-forced-tool-call-reports-empty-arguments).

vLLM 0.32 finishes a Qwen3-Coder call cut by `max_tokens` (no `</function>`) by converting only its closed
`<parameter>` blocks: a call cut inside its first parameter (`<parameter=zone>\nAsia/To`) or before any comes
back non-stream as `arguments: "{}"`, valid JSON claiming a complete call with no arguments (violating the
tool's `required`); the stream sends the cut JSON prefix (`{"zone": "Asia/To`) and then, at the end, whatever
completes the final conversion (a cut before any parameter streams `{}` too). OpenAI's semantics for a cut
answer: `finish_reason` "length" and `arguments` the text generated so far, which need not parse; a tool call
has no "incomplete" flag a client would read, and invalid JSON beside finish_reason "length" is what OpenAI
clients already handle. So a cut call's arguments are the parser's own streaming prefix of the partial
arguments (`_safe_arg_prefix`: up to the last value, a string value without its closing quote), `""` when no
parameter began, never completed into a closed object: the same text streamed and non-stream.
finish_reason stays vLLM's ("length"). Calls whose `</function>` came are untouched.

Seam (vLLM 0.32, parser/engine/): `StreamingParserEngine.finish` (records which call, if any, was still open
when the output ended; `.reset` clears it), `ParserEngine._flush_arg_converter` (the stream's closing flush:
skipped for that call) and `ParserEngine._build_extracted_result` (the non-stream result: that call's
arguments replaced); the conversion helpers `_arg_converter`, `_fix_arg_types`, `_safe_arg_prefix` and
`_streamable_string_keys` are the engine's own.
"""
from __future__ import annotations

import functools

from ..core import seams

__all__ = ["PATCH", "truncated_arguments"]

ENGINE = "vllm.parser.engine.parser_engine:ParserEngine"
STREAMING_ENGINE = "vllm.parser.engine.streaming_parser_engine:StreamingParserEngine"
STATES = "vllm.parser.engine.parser_engine_config:ParserState"
PROPERTIES = "vllm.parser.engine.parser_engine:find_tool_properties"
HELPERS = ("_build_extracted_result", "_flush_arg_converter", "_fix_arg_types", "_safe_arg_prefix",
           "_streamable_string_keys")
OPEN_CALL = "_qwen36_open_tool_index"
# States in which a call's name or arguments are still being written (TOOL_BETWEEN: its function closed).
OPEN_STATES = ("TOOL_PREAMBLE", "TOOL_NAME", "TOOL_ARGS")


def truncated_arguments(engine, slot) -> str:
    """An unfinished call's arguments: the streaming prefix of its partial conversion (module docstring)."""
    keys = engine._streamable_string_keys(seams.resolve(PROPERTIES)(engine._tools, slot.name))
    partial = engine._arg_converter(slot.args, True)
    return engine._safe_arg_prefix(engine._fix_arg_types(partial, slot.name) if partial else "", keys)


def _open_call(parser) -> int | None:
    return getattr(getattr(parser, "_engine", None), OPEN_CALL, None)


def _wrap_finish(original):
    states = seams.resolve(STATES)
    open_states = {getattr(states, name) for name in OPEN_STATES}

    @functools.wraps(original)
    def finish(self):
        setattr(self, OPEN_CALL, self.tool_index if self.state in open_states and self.tool_index >= 0 else None)
        return original(self)

    return finish


def _wrap_reset(original):
    @functools.wraps(original)
    def reset(self, *args, **kwargs):
        setattr(self, OPEN_CALL, None)  # a new parse: nothing is cut yet
        return original(self, *args, **kwargs)

    return reset


def _wrap_flush(original):
    @functools.wraps(original)
    def _flush_arg_converter(self, idx):
        if idx == _open_call(self):
            return None  # a cut call: what streamed so far is its arguments; completing them would claim an end
        return original(self, idx)

    return _flush_arg_converter


def _wrap_build(original):
    @functools.wraps(original)
    def _build_extracted_result(self, *deltas):
        result = original(self, *deltas)
        index = _open_call(self)
        if index is None or self._arg_converter is None or index >= len(self._tool_slots):
            return result  # no open call, or JSON arguments (vLLM already returns their raw text)
        slot = self._tool_slots[index]
        for call in result.tool_calls:
            if slot.id and call.id == slot.id:
                call.function.arguments = truncated_arguments(self, slot)
        return result

    return _build_extracted_result


def probe() -> str | None:
    return seams.first_problem(f"{STREAMING_ENGINE}.finish", f"{STREAMING_ENGINE}.reset", PROPERTIES,
                               *(f"{ENGINE}.{h}" for h in HELPERS), *(f"{STATES}.{s}" for s in OPEN_STATES))


# The table's seam column names the two result paths; StreamingParserEngine.finish/.reset are in the docstring.
PATCH = seams.api_patch(
    "truncated_tool_arguments", "QWEN36_PATCH_TRUNCATED_TOOL_ARGS",
    "ParserEngine._build_extracted_result/._flush_arg_converter", probe,
    (seams.WrappedMethod(STREAMING_ENGINE, "finish", _wrap_finish),
     seams.WrappedMethod(STREAMING_ENGINE, "reset", _wrap_reset),
     seams.WrappedMethod(ENGINE, "_flush_arg_converter", _wrap_flush),
     seams.WrappedMethod(ENGINE, "_build_extracted_result", _wrap_build)),
    "a call cut before its end: arguments = the text generated so far, streamed or not; finish_reason kept")
