"""Reduce a chat or completions answer, streamed or not, to the same per-choice view: text, reasoning,
tool calls and every finish_reason seen. Lets invariants compare a stream with its non-stream twin."""
from __future__ import annotations

from dataclasses import dataclass, field

from tests.api_conformance.transport import Exchange


@dataclass
class ToolCallView:
    name: str = ""
    arguments: str = ""


@dataclass
class ChoiceView:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallView] = field(default_factory=list)
    finish_reasons: list = field(default_factory=list)
    has_tool_calls_key: bool = False


def _choice(views: dict[int, ChoiceView], index: int) -> ChoiceView:
    return views.setdefault(index, ChoiceView())


def choices(ex: Exchange) -> dict[int, ChoiceView]:
    """Per choice index; a stream is folded event by event (tool-call deltas merged by their index)."""
    views: dict[int, ChoiceView] = {}
    if ex.streamed:
        for event in ex.events:
            if not isinstance(event, dict):
                continue
            for ch in event.get("choices") or []:
                view = _choice(views, ch["index"])
                _fold(view, ch.get("delta") or {}, ch.get("text"))
                if ch.get("finish_reason") is not None:
                    view.finish_reasons.append(ch["finish_reason"])
        return views
    for ch in (ex.body or {}).get("choices") or []:
        view = _choice(views, ch["index"])
        message = ch.get("message") or {}
        view.content = message.get("content") or ch.get("text") or ""
        view.reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
        view.has_tool_calls_key = "tool_calls" in message
        for tc in message.get("tool_calls") or []:
            view.tool_calls.append(ToolCallView(tc["function"]["name"], tc["function"]["arguments"]))
        view.finish_reasons.append(ch.get("finish_reason"))
    return views


def _fold(view: ChoiceView, delta: dict, text: str | None) -> None:
    view.content += delta.get("content") or text or ""
    view.reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
    if "tool_calls" in delta:
        view.has_tool_calls_key = True
    for tc in delta.get("tool_calls") or []:
        i = tc.get("index", 0)
        while len(view.tool_calls) <= i:
            view.tool_calls.append(ToolCallView())
        fn = tc.get("function") or {}
        view.tool_calls[i].name += fn.get("name") or ""
        view.tool_calls[i].arguments += fn.get("arguments") or ""


def usage(ex: Exchange) -> dict | None:
    """The answer's usage: the body's, or the last stream event that carries one."""
    if ex.streamed:
        found = [e["usage"] for e in ex.events if isinstance(e, dict) and e.get("usage")]
        return found[-1] if found else None
    return (ex.body or {}).get("usage") if isinstance(ex.body, dict) else None
