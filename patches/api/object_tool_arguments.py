"""Accept assistant tool-call `arguments` given as a JSON object (deviation object-tool-call-arguments-rejected).

The platform replays assistant tool calls with `function.arguments` as an object. vLLM 0.32 validates
`messages` against OpenAI's TypedDicts, where `arguments` is a string, and refuses the request (400 "Input
should be a valid string"). vLLM's renderer itself wants objects: `renderers/chat_utils._postprocess_messages`
parses the string back into a dict before the chat template runs. So the patch serialises an object to its
JSON string before validation; the renderer parses it back to the same dict (key order kept), and the prompt
is the one the string form gives. Anything else that is not a string (a list, a number) is left to vLLM's
validation and still refused.

Seam (vLLM 0.32): `ChatCompletionRequest` (entrypoints/openai/chat_completion/protocol.py) gains a
`mode="before"` model validator; the renderer contract is `_postprocess_messages` in renderers/chat_utils.py.
"""
from __future__ import annotations

import json
from typing import Any

from ..core import seams

__all__ = ["PATCH", "stringify_object_arguments"]

REQUEST_MODEL = "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest"
RENDERER_STEP = "vllm.renderers.chat_utils:_postprocess_messages"
VALIDATOR = "_qwen36_object_tool_arguments"


def stringify_object_arguments(data: Any) -> Any:
    """The request body with every assistant tool call's object `arguments` as its JSON string (in place,
    as vLLM's own before-validators do)."""
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        return data
    for message in data["messages"]:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), dict):
                function["arguments"] = json.dumps(function["arguments"], ensure_ascii=False)
    return data


def probe() -> str | None:
    return seams.first_problem(RENDERER_STEP) or seams.model_problem(REQUEST_MODEL, ("messages",))


PATCH = seams.api_patch(
    "object_tool_arguments", "QWEN36_PATCH_OBJECT_TOOL_ARGS", "ChatCompletionRequest (model validator, before)",
    probe, (seams.AddedValidator(REQUEST_MODEL, VALIDATOR, stringify_object_arguments),),
    "object tool-call arguments sent as their JSON string; vLLM's renderer parses them back")
