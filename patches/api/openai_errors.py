"""Error bodies in OpenAI's shape: `error.type` and `error.param` as OpenAI's API spells them.

vLLM 0.32 names the error type after the HTTP phrase or its exception class ("Bad Request",
"BadRequestError", "NotFoundError") and reports request-validation errors at their FastAPI location
("body.messages"; "body.60" for a JSON syntax error at byte 60). OpenAI says `invalid_request_error` for every
4xx (404 for an unknown model included), `server_error` for 5xx, and `param` is the request field
("messages") or null when no field is at fault. Clients that branch on `error.type` or show `error.param`
(the platform's basic tests do) need that shape. Message and the HTTP status stay vLLM's; `error.code` is
patches/api/openai_error_codes.py's.

Seam (vLLM 0.32): `ErrorInfo` (entrypoints/serve/engine/protocol.py), the one model every error path builds
(create_error_response, the validation and HTTP exception handlers, streaming errors): a `mode="before"`
model validator rewrites `type` and `param`. `ErrorResponse`, which embeds it, is rebuilt too.
"""
from __future__ import annotations

import re
from typing import Any

from ..core import seams

__all__ = ["PATCH", "openai_error_fields"]

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


def probe() -> str | None:
    return seams.first_problem(ERROR_RESPONSE) or seams.model_problem(ERROR_INFO, ("type", "param", "code", "message"))


PATCH = seams.api_patch(
    "openai_errors", "QWEN36_PATCH_OPENAI_ERRORS", "ErrorInfo (model validator, before)", probe,
    (seams.AddedValidator(ERROR_INFO, VALIDATOR, openai_error_fields, rebuild=(ERROR_RESPONSE,)),),
    "error.type invalid_request_error (4xx) / server_error (5xx); error.param the request field")
