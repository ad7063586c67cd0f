"""Turn a server's answer into what a snapshot pins: its structure, not what legitimately varies.

Kept: HTTP status, every key, value types, finish_reason / stop_reason, tool-call names, whether tool-call
arguments are valid JSON objects, error type / param / code, token counts, the order of stream events.
Replaced: ids, timestamps, fingerprints, the served model name, generated text, logprob values and tokens,
and cache counters (they depend on which requests ran before, e.g. under pytest-xdist).
Stream events are normalised one by one and consecutive identical shapes are collapsed, because how many
chunks a text arrives in depends on token boundaries, not on the API.
"""
from __future__ import annotations

import json
from typing import Any

from tests.api_conformance.transport import Exchange

PLACEHOLDERS = {"id": "<id>", "created": "<timestamp>", "system_fingerprint": "<fingerprint>", "model": "<model>"}
GENERATED_TEXT_KEYS = {"content", "reasoning", "reasoning_content", "text", "message"}
CACHE_COUNTERS = {"cached_tokens", "created_cache_tokens"}


def text_marker(value: Any) -> Any:
    if isinstance(value, str):
        return "<text>" if value else ""
    return normalise_value(value)


def arguments_marker(value: Any) -> Any:
    if not isinstance(value, str):
        return normalise_value(value)
    if value == "":
        return ""  # a streamed name chunk carries empty arguments
    try:
        parsed = json.loads(value)
    except ValueError:
        return "<invalid-json>"
    return "<json-object>" if isinstance(parsed, dict) else f"<json-{type(parsed).__name__}>"


def logprobs_marker(value: Any) -> Any:
    """Logprob payloads: keep list lengths and keys of fixed schema; tokens and numbers vary."""
    if isinstance(value, list):
        return [logprobs_marker(v) for v in value]
    if isinstance(value, dict):
        if value and all(isinstance(v, (int, float)) for v in value.values()) and "logprob" not in value:
            return "<token->logprob map>"  # completions' top_logprobs: keys are tokens
        return {k: logprobs_marker(v) for k, v in value.items()}
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return f"<{type(value).__name__}>"
    if isinstance(value, str):
        return "<token>"
    return value


def normalise_value(value: Any, key: str | None = None, stream: bool = False) -> Any:
    if key in PLACEHOLDERS and value is not None:
        return PLACEHOLDERS[key]
    if key in GENERATED_TEXT_KEYS:
        # In a stream an empty text delta (a token that ends mid-character) is just a text chunk: the
        # server may coalesce it with its neighbours under load.
        return "<text>" if stream and value == "" else text_marker(value)
    if key == "arguments":
        return arguments_marker(value)
    if key in CACHE_COUNTERS and isinstance(value, int):
        return "<int>"
    if key in ("logprobs", "prompt_logprobs") and value is not None:
        return logprobs_marker(value)
    if isinstance(value, dict):
        return {k: normalise_value(v, k, stream) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise_value(v, None, stream) for v in value]
    if isinstance(value, float):
        return "<float>"
    return value


def collapse_runs(items: list) -> list:
    out: list = []
    for item in items:
        if not out or out[-1] != item:
            out.append(item)
    return out


def normalise_exchange(ex: Exchange) -> dict:
    if ex.streamed:
        events = [e if e == "[DONE]" else normalise_value(e, stream=True) for e in ex.events]
        return {"status": ex.status, "stream_events": collapse_runs(events)}
    return {"status": ex.status, "body": normalise_value(ex.body)}
