"""Send one corpus case to a server and keep everything the assertions need: status, JSON body or the
ordered SSE events, and how long it took. Streams are read to the end or to the client timeout, so a
server that never finishes fails the test instead of hanging it."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "models": "/v1/models"}


@dataclass
class Exchange:
    status: int
    elapsed_s: float
    body: Any = None  # parsed JSON of a non-stream answer (or of an error), None if not JSON
    text: str = ""  # raw body of a non-stream answer
    events: list = field(default_factory=list)  # stream: parsed JSON events, then "[DONE]" if it came
    raw_events: list = field(default_factory=list)  # stream: data lines as received

    @property
    def streamed(self) -> bool:
        return bool(self.raw_events)


def served_context_tokens(server, timeout_s: float = 30.0) -> int | None:
    """The served model's context length as vLLM's /v1/models reports it (`max_model_len`), None when the
    server does not say. `server`: its `base_url` and `api_key` (harness.serving.shared_server.ServerInfo)."""
    r = httpx.get(server.base_url.rstrip("/") + "/v1/models", timeout=timeout_s, headers=_auth(server.api_key))
    r.raise_for_status()
    value = (r.json().get("data") or [{}])[0].get("max_model_len")
    return int(value) if isinstance(value, int) else None


def send(server, endpoint: str, body: Any = None, raw: str | None = None, timeout_s: float = 120.0) -> Exchange:
    """`server`: its `base_url` and the `api_key` its requests carry (harness.serving.shared_server.ServerInfo)."""
    url = server.base_url.rstrip("/") + ENDPOINTS[endpoint]
    headers = {"Content-Type": "application/json", **_auth(server.api_key)}
    content = raw.encode() if raw is not None else json.dumps(body).encode()
    stream = raw is None and isinstance(body, dict) and bool(body.get("stream"))
    t0 = time.monotonic()
    with httpx.Client(timeout=httpx.Timeout(timeout_s)) as client:
        if endpoint == "models":
            r = client.get(url, headers=headers)
            return _plain(r, time.monotonic() - t0)
        with client.stream("POST", url, content=content, headers=headers) as r:
            if not stream or r.status_code != 200 or "text/event-stream" not in r.headers.get("content-type", ""):
                r.read()
                return _plain(r, time.monotonic() - t0)
            ex = Exchange(status=r.status_code, elapsed_s=0.0)
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                ex.raw_events.append(data)
                ex.events.append("[DONE]" if data == "[DONE]" else _json_or_text(data))
            ex.elapsed_s = time.monotonic() - t0
            return ex


def _auth(api_key: str | None) -> dict[str, str]:
    """A server started with --api-key answers 401 to a request without `Authorization: Bearer KEY`."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _plain(r: httpx.Response, elapsed: float) -> Exchange:
    return Exchange(status=r.status_code, elapsed_s=elapsed, body=_json_or_text(r.text), text=r.text)


def _json_or_text(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return {"__unparsed__": data}
