"""The chat template the image ships renders the conformance message corpus.

The template checked is the file the Dockerfile copies to the run config's --chat-template path (so a wrong
path is caught here too). Each renderable case must render and contain every text message verbatim; each
case the corpus marks as an error must be refused (raise_exception). Messages go in as the corpus writes
them (the corpus has its own cases for what vLLM's endpoint pre-processes). Only user and system texts are
required verbatim: the template may legitimately drop an old assistant turn's reasoning.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from . import names
from .checks import Context, _template_copy_source, presubmit_check

MESSAGES_FILE = Path("fixtures/api/messages.yaml")

# Used only when the conformance corpus is absent; the detail says so.
BUILTIN_CASES: dict[str, dict[str, Any]] = {
    "user_only": {"messages": [{"role": "user", "content": "Hello there."}],
                  "kwargs": {"add_generation_prompt": True}},
    "two_systems": {"messages": [{"role": "system", "content": "Rule one."}, {"role": "system", "content": "Rule two."},
                                 {"role": "user", "content": "Hi."}], "kwargs": {"add_generation_prompt": True}},
    "tool_round_trip": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny, 21 C"},
        ],
        "kwargs": {"add_generation_prompt": True},
    },
}


class _Refused(Exception):
    pass


def _raise(message: str) -> None:
    raise _Refused(message)


def _environment():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # transformers' settings for chat templates, and the two helpers every HF template may call.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = _raise
    return env


def _texts(messages: list) -> list[str]:
    return [m["content"] for m in messages if isinstance(m, dict) and m.get("role") in ("user", "system")
            and isinstance(m.get("content"), str) and m["content"].strip()]


@presubmit_check(names.CHAT_TEMPLATE)
def check_chat_template(ctx: Context) -> tuple[bool, str]:
    template_path, why = _template_copy_source(ctx)
    if template_path is None:
        return False, why
    if not template_path.exists():
        return False, f"{ctx.rel(template_path)} does not exist"
    corpus_path = ctx.root / MESSAGES_FILE
    if corpus_path.exists():
        corpus = yaml.safe_load(corpus_path.read_text())
        cases, source = corpus.get("cases") or {}, str(MESSAGES_FILE)
    else:
        cases, source = BUILTIN_CASES, f"built-in corpus ({MESSAGES_FILE} is absent)"
    try:
        template = _environment().from_string(template_path.read_text())
    except Exception as exc:
        return False, f"{ctx.rel(template_path)} does not compile: {exc}"
    problems, rendered, refused = [], 0, 0
    for name, case in cases.items():
        messages = case["messages"]
        case_tools = case.get("tools")  # the corpus names tools per case (YAML anchors expand here)
        try:
            text = template.render(messages=messages, tools=case_tools, **(case.get("kwargs") or {}))
        except _Refused as exc:
            if case.get("error") is None:
                problems.append(f"{name}: refused ({exc})")
            else:
                refused += 1
            continue
        except Exception as exc:
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if case.get("error") is not None:
            problems.append(f"{name}: rendered although the corpus says it must be refused")
            continue
        missing = [t for t in _texts(messages) if t not in text]
        if missing:
            problems.append(f"{name}: message text missing from the render ({missing[0][:40]!r})")
        rendered += 1
    if problems:
        return False, (f"{ctx.rel(template_path)} against {source}: " + "; ".join(problems[:5])
                       + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))
    return True, (f"{ctx.rel(template_path)}: {rendered} cases rendered with every message text, {refused} "
                  f"refused as required ({source})")
