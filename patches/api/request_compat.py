"""Request compatibility helpers for callers that render the chat template without vLLM's server.

vLLM's chat endpoint parses assistant tool-call `arguments` given as a JSON string into an object before
the template runs (renderers/chat_utils.py `_postprocess_messages`). Jinja cannot parse JSON, so a direct
`apply_chat_template` call needs the same step; this one refuses bad input instead of coercing it to `{}`
as vLLM does, because silently dropping arguments changes the prompt.
"""
from __future__ import annotations

import copy
import json
from typing import Any


class ToolCallArgumentsError(ValueError):
    """An assistant tool call whose `arguments` string is not a JSON object."""


def parse_tool_call_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A deep copy of `messages` with every assistant tool call's JSON-string `arguments` parsed to a dict.

    Empty or missing arguments become `{}`; objects are kept. Raises ToolCallArgumentsError naming the
    message index, the tool call and the reason when a string is not JSON or not a JSON object.
    """
    out = copy.deepcopy(messages)
    for i, message in enumerate(out):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for j, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function", call) if isinstance(call, dict) else None
            if not isinstance(function, dict):
                raise ToolCallArgumentsError(f"message {i} (assistant): tool_calls[{j}] is not an object")
            args = function.get("arguments")
            if args is None or (isinstance(args, str) and not args.strip()):
                function["arguments"] = {}
            elif isinstance(args, str):
                name = function.get("name", "?")
                try:
                    parsed = json.loads(args)
                except json.JSONDecodeError as exc:
                    raise ToolCallArgumentsError(
                        f"message {i} (assistant): tool_calls[{j}] ({name}) arguments are not valid JSON "
                        f"({exc.msg} at position {exc.pos}); send a JSON object string such as '{{\"city\": \"Paris\"}}'"
                    ) from exc
                if not isinstance(parsed, dict):
                    raise ToolCallArgumentsError(
                        f"message {i} (assistant): tool_calls[{j}] ({name}) arguments decode to "
                        f"{type(parsed).__name__}, not a JSON object"
                    )
                function["arguments"] = parsed
    return out
