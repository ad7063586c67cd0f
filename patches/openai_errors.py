"""Error bodies in OpenAI's shape: `error.type` and `error.param` as OpenAI's API spells them.

vLLM 0.32 names the error type after the HTTP phrase or its exception class ("Bad Request",
"BadRequestError", "NotFoundError") and reports request-validation errors at their FastAPI location
("body.messages"; "body.60" for a JSON syntax error at byte 60). OpenAI says `invalid_request_error` for every
4xx (404 for an unknown model included), `server_error` for 5xx, and `param` is the request field
("messages") or null when no field is at fault. Clients that branch on `error.type` or show `error.param`
(the platform's basic tests do) need that shape. Message and the HTTP status stay vLLM's; `code` stays the
status number vLLM sends (OpenAI sends a string code or null; no client we know reads it).

Seam (vLLM 0.32): `ErrorInfo` (entrypoints/serve/engine/protocol.py), the one model every error path builds
(create_error_response, the validation and HTTP exception handlers, streaming errors): a `mode="before"`
model validator rewrites `type` and `param`. `ErrorResponse`, which embeds it, is rebuilt too.
"""
from __future__ import annotations

import re
from typing import Any

from . import seams
from .registry import Patch
from .settings import OPENAI_ERRORS_ENV, PatchSettings

__all__ = ["PATCH", "openai_error_fields", "uninstall"]

ERROR_INFO = "vllm.entrypoints.serve.engine.protocol:ErrorInfo"
ERROR_RESPONSE = "vllm.entrypoints.serve.engine.protocol:ErrorResponse"
VALIDATOR = "_qwen36_openai_error_shape"
_BODY_PREFIX = re.compile(r"^body(\.|$)")


def openai_param(param: Any) -> Any:
    """FastAPI's `body.messages` -> `messages`; a bare location (`body`, or `body.60`, a byte offset of a
    JSON syntax error) names no field -> None."""
    if not isinstance(param, str):
        return param
    field = _BODY_PREFIX.sub("", param)
    if not field or field.isdigit():
        return None
    return field


def openai_type(code: Any, vllm_type: Any) -> Any:
    try:
        status = int(code)
    except (TypeError, ValueError):
        return vllm_type
    if 400 <= status < 500:
        return "invalid_request_error"
    if status >= 500:
        return "server_error"
    return vllm_type


def openai_error_fields(data: Any) -> Any:
    """ErrorInfo's constructor arguments with OpenAI's `type` and `param`."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    out["type"] = openai_type(out.get("code"), out.get("type"))
    if "param" in out:
        out["param"] = openai_param(out["param"])
    return out


def _validator(cls, data: Any) -> Any:
    return openai_error_fields(data)


def probe() -> str | None:
    for path in (ERROR_INFO, ERROR_RESPONSE):
        if (problem := seams.attribute_problem(path)) is not None:
            return problem
    model = seams.resolve(ERROR_INFO)
    if (problem := seams.pydantic_problem(model)) is not None:
        return problem
    missing = {"type", "param", "code", "message"} - set(model.model_fields)
    if missing:
        return f"ErrorInfo has no {', '.join(sorted(missing))} field"
    return None


def enabled(settings: PatchSettings) -> tuple[bool, str]:
    if not settings.openai_errors:
        return False, f"{OPENAI_ERRORS_ENV}=1 turns it on"
    return True, ""


def install(settings: PatchSettings) -> str:
    seams.add_model_validator(seams.resolve(ERROR_INFO), VALIDATOR, _validator, mode="before",
                              rebuild=(seams.resolve(ERROR_RESPONSE),))
    return "error.type invalid_request_error (4xx) / server_error (5xx); error.param the request field"


def uninstall() -> None:
    seams.remove_model_validator(seams.resolve(ERROR_INFO), VALIDATOR, rebuild=(seams.resolve(ERROR_RESPONSE),))


PATCH = Patch(name="openai_errors", seam="ErrorInfo (model validator, before)", required=True,
              enabled=enabled, probe=probe, install=install)
