"""The chat-template message corpus, fixtures/api/messages.yaml."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

from harness.paths import FIXTURES

MESSAGES_FILE = FIXTURES / "api" / "messages.yaml"


@dataclass(frozen=True)
class MessageCase:
    name: str
    messages: list
    tools: list | None = None
    kwargs: dict = field(default_factory=dict)
    error: dict | None = None  # {index, role, reason} the refusal must name


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    return yaml.safe_load(MESSAGES_FILE.read_text())


def message_cases() -> list[MessageCase]:
    return [MessageCase(name=name, **spec) for name, spec in _raw()["cases"].items()]


def renderable_cases() -> list[MessageCase]:
    return [c for c in message_cases() if c.error is None]


def refused_cases() -> list[MessageCase]:
    return [c for c in message_cases() if c.error is not None]


def string_argument_pairs() -> list[tuple[list, list]]:
    return [(p["string_form"], p["object_form"]) for p in _raw()["string_argument_pairs"]]


def corpus_tools() -> list:
    return _raw()["tools"]
