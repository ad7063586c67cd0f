"""The request corpus, fixtures/api/requests.yaml, as named `RequestCase`s (the tool_choice matrix
expanded, the served model filled in at send time)."""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any

import yaml

from harness.paths import FIXTURES

REQUESTS_FILE = FIXTURES / "api" / "requests.yaml"
DEFAULT_TIMEOUT_S = 120.0
# The `expect` keys checks.semantics reads; the header of requests.yaml says what each asserts
# (tests/unit/test_api_fixtures.py keeps the header, this declaration and checks.py in step). A key not
# declared here is refused when the corpus loads: a misspelt expectation would otherwise assert nothing.
EXPECT_KEYS = ("status", "error_param", "error_code", "choices", "choices_or_4xx", "max_seconds", "tool_calls", "tool_name",
               "finish_reason", "echo_prompt", "prompt_tokens")
MATRIX_CHOICE_KEYS = ("tool_choice", "expect")
# A message content written as this is sent as a prompt longer than the served context (its length read from
# the server's /v1/models at send time), so the case is beyond any target's context, 8K or 245K.
PROMPT_BEYOND_CONTEXT = "<a prompt beyond the served context>"


@dataclass(frozen=True)
class RequestCase:
    name: str
    family: str
    endpoint: str = "chat"
    body: dict | None = None
    raw: str | None = None
    expect: dict = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    greedy_pair: str | None = None
    same_prompt_as: str | None = None

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream"))

    @property
    def needs_context_length(self) -> bool:
        messages = (self.body or {}).get("messages")
        # A bad-input case may send `messages` that is not a list of objects.
        return isinstance(messages, list) and any(isinstance(m, dict) and m.get("content") == PROMPT_BEYOND_CONTEXT
                                                  for m in messages)

    def request_body(self, model: str, context_tokens: int | None = None) -> dict | None:
        """The body to send: the served model filled in and, for a case that needs one, a prompt beyond
        `context_tokens` (the server's max_model_len)."""
        if self.body is None:
            return None
        body = copy.deepcopy(self.body)
        body.setdefault("model", model)
        if self.needs_context_length:
            if context_tokens is None:
                raise ValueError(f"case {self.name} sends a prompt beyond the served context: give context_tokens")
            # " hello" is at least one token in any tokenizer the suite meets; 64 more than fit is beyond.
            beyond = "hello" + " hello" * (context_tokens + 64)
            for m in body["messages"]:
                if isinstance(m, dict) and m.get("content") == PROMPT_BEYOND_CONTEXT:
                    m["content"] = beyond
        return body


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    return yaml.safe_load(REQUESTS_FILE.read_text())


def case_keys() -> tuple[str, ...]:
    """The keys a case of `cases:` may have (its name is the mapping's key)."""
    return tuple(f.name for f in fields(RequestCase) if f.name != "name")


def _check_keys(where: str, what: str, given, known) -> None:
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"{REQUESTS_FILE}: {where} has unknown {what} {unknown}; the known ones are "
                         f"{sorted(known)}")


def _tool_choice_cases(spec: dict) -> list[RequestCase]:
    cases = []
    for choice, c in spec["choices"].items():
        where = f"tool_choice_matrix choice {choice!r}"
        _check_keys(where, "key(s)", c, MATRIX_CHOICE_KEYS)
        _check_keys(where, "expect key(s)", c["expect"], EXPECT_KEYS)
        for stream in (False, True):
            for thinking in (True, False):
                body = copy.deepcopy(spec["body"])
                body["tool_choice"] = c["tool_choice"]
                body["chat_template_kwargs"] = {"enable_thinking": thinking}
                if stream:
                    body["stream"] = True
                    body["stream_options"] = {"include_usage": True}
                name = f"chat_tool_choice_{choice}_{'stream' if stream else 'nonstream'}_thinking_{'on' if thinking else 'off'}"
                pair = None if stream else name.replace("_nonstream_", "_stream_")
                cases.append(RequestCase(
                    name=name, family=spec["family"], body=body, expect={"status": 200, **c["expect"]},
                    greedy_pair=pair,
                ))
    return cases


@lru_cache(maxsize=1)
def request_cases() -> tuple[RequestCase, ...]:
    return build_cases(_raw())


def build_cases(raw: dict[str, Any]) -> tuple[RequestCase, ...]:
    """The corpus's cases from the parsed file; unknown case or `expect` keys raise ValueError."""
    cases = []
    for name, spec in raw["cases"].items():
        _check_keys(f"case {name!r}", "key(s)", spec, case_keys())
        _check_keys(f"case {name!r}", "expect key(s)", spec.get("expect", {}), EXPECT_KEYS)
        cases.append(RequestCase(name=name, **spec))
    cases += _tool_choice_cases(raw["tool_choice_matrix"])
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "duplicate case names in the request corpus"
    return tuple(cases)


def case(name: str) -> RequestCase:
    return next(c for c in request_cases() if c.name == name)


def corpus_tools() -> list[dict]:
    return _raw()["tools"]


def cached_prefix_body(model: str) -> dict:
    """The cached-prefix request: a long system prompt of seeded words (not shared with any other case)."""
    spec = _raw()["cached_prefix"]
    rng = random.Random("cached_prefix")
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud".split()
    system = " ".join(rng.choice(words) for _ in range(spec["prefix_words"]))
    body = copy.deepcopy(spec["body"])
    body["messages"] = [{"role": "system", "content": system}, *body["messages"]]
    body["model"] = model
    return body
