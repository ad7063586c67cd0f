"""Error bodies' `error.code` as OpenAI spells it: a string or null, never the HTTP status.

vLLM 0.32 copies the HTTP status into `error.code` (400, 404). OpenAI's `code` is a string or null, and two
of its values are what clients branch on:
- `context_length_exceeded`: the prompt does not fit the context window. Agent clients shorten or compact the
  conversation on it (Codex does, by this exact code); the platform's 235K-token inputs sit near the 245K
  window, so this is the refusal its long requests meet.
- `model_not_found`: the request names a model the server does not serve (404).
Every other refusal gets null, which claims nothing. A typed client whose `code` is a string (or null) cannot
parse vLLM's integer.

Only the body changes. vLLM reads `ErrorInfo.code` as the response's HTTP status
(`JSONResponse(..., status_code=err.error.code)`), so the attribute keeps the status and a model serializer
rewrites the dumped `code`; FastAPI's responses and streamed errors both come from that dump.

The codes are read from vLLM's own messages, so the probe checks that vLLM still writes them:
"maximum context length" (renderers/params.py, the prompt-length checks) and "does not exist" (the model
check of entrypoints/serve/engine/serving.py). `max_tokens` beyond the context is not
`context_length_exceeded`: vLLM words it "max_tokens=... cannot be greater than ...", and shortening the
conversation would not help; it gets null.

Seam (vLLM 0.32): `ErrorInfo` (entrypoints/serve/engine/protocol.py), a wrap model serializer; `ErrorResponse`,
which embeds it, is rebuilt too.
"""
from __future__ import annotations

import re
from typing import Any

from ..core import seams

__all__ = ["PATCH", "openai_error_code"]

ERROR_INFO = "vllm.entrypoints.serve.engine.protocol:ErrorInfo"
ERROR_RESPONSE = "vllm.entrypoints.serve.engine.protocol:ErrorResponse"
PROMPT_LENGTH_CHECKS = "vllm.renderers.params:TokenizeParams"
MODEL_CHECK = "vllm.entrypoints.serve.engine.serving:BaseServing._check_model"
SERIALIZER = "_qwen36_openai_error_code"
_CONTEXT_EXCEEDED = re.compile(r"maximum context length", re.IGNORECASE)
_MODEL_MISSING = re.compile(r"^The model `.*` does not exist")


def openai_error_code(status: Any, message: Any) -> str | None:
    """OpenAI's `error.code` for a refusal with this HTTP status and vLLM message."""
    text = message if isinstance(message, str) else ""
    if status == 400 and _CONTEXT_EXCEEDED.search(text):
        return "context_length_exceeded"
    if status == 404 and _MODEL_MISSING.search(text):
        return "model_not_found"
    return None


def _dumped_with_openai_code(info: Any, dumped: dict) -> dict:
    if "code" in dumped:
        dumped["code"] = openai_error_code(info.code, info.message)
    return dumped


def probe() -> str | None:
    return (seams.first_problem(ERROR_RESPONSE, PROMPT_LENGTH_CHECKS, MODEL_CHECK)
            or seams.model_problem(ERROR_INFO, ("code", "message"))
            or seams.serializer_problem(ERROR_INFO, SERIALIZER)
            or seams.source_problem(PROMPT_LENGTH_CHECKS, "maximum context length")
            or seams.source_problem(MODEL_CHECK, "does not exist"))


PATCH = seams.api_patch(
    "openai_error_codes", "QWEN36_PATCH_OPENAI_ERROR_CODES", "ErrorInfo (model serializer, wrap)", probe,
    (seams.AddedSerializer(ERROR_INFO, SERIALIZER, _dumped_with_openai_code, rebuild=(ERROR_RESPONSE,)),),
    "error.code context_length_exceeded / model_not_found / null in the body; the HTTP status unchanged")
