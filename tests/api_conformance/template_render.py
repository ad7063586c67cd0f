"""Render the patch set's chat template two independent ways: plain jinja2 and transformers.

Plain jinja2 uses jinja's defaults (no trim_blocks / lstrip_blocks, unlike transformers) so that agreement
between the two also shows the template controls its own whitespace. Both get the two helpers every HF
chat template may use: `raise_exception` and a `tojson` that does not HTML-escape (transformers' version).
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from harness.paths import PATCH_CHAT_TEMPLATE


class TemplateRefused(Exception):
    """The template called raise_exception."""


def _raise(message: str) -> None:
    raise TemplateRefused(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def template_source() -> str:
    return PATCH_CHAT_TEMPLATE.read_text()


@lru_cache(maxsize=1)
def _jinja_template() -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env.from_string(template_source())


def render_jinja(messages: list, tools: list | None = None, **kwargs: Any) -> str:
    return _jinja_template().render(messages=messages, tools=tools, **kwargs)


@lru_cache(maxsize=1)
def _hf_tokenizer():
    # A word-level tokenizer with a one-word vocabulary is enough: only the template text is compared.
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template_source())


def render_transformers(messages: list, tools: list | None = None, **kwargs: Any) -> str:
    """transformers' apply_chat_template (what vLLM calls for HF tokenizers), text only."""
    from jinja2.exceptions import TemplateError

    try:
        return _hf_tokenizer().apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
    except TemplateError as exc:  # transformers turns raise_exception into TemplateError
        raise TemplateRefused(str(exc)) from exc
