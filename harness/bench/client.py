"""One streaming request, timed as docs/design.md defines it, turned into a `RequestRecord`.

Clocks are `time.monotonic_ns()`: `t0` just before the request is sent (the moment httpcore starts writing
the request line and headers, from its trace hook, so that connection-pool work and a first connection's
set-up in the client are not counted as server latency; `t_call_ns` keeps the moment the call began),
`t_first` / `t_last` at the first /
last SSE event that carries generated output (content, reasoning or a tool-call delta; a role-only chunk
or an empty string does not count), `t_end` at `[DONE]` (or when the failure was seen). Token counts come
only from the final `usage` chunk; a missing `usage` or `cached_tokens` stays `None`, never zero.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import httpx

SUCCESS_FINISH_REASONS = frozenset({"stop", "length", "tool_calls"})
FAILURE_CLASSES = ("http_status", "stream_error", "timeout", "disconnect", "empty_output", "usage_missing")


@dataclass
class RequestRecord:
    request_id: str
    endpoint: str
    t0_ns: int | None = None  # None: never sent
    t_call_ns: int | None = None
    t_first_ns: int | None = None
    t_last_ns: int | None = None
    t_end_ns: int | None = None
    # Raw, not metrics: first / last chunk with any `choices` (a role-only chunk included), the points
    # other tools (vLLM's benchmark client) time from; kept to compare definitions.
    t_first_chunk_ns: int | None = None
    t_last_chunk_ns: int | None = None
    http_status: int | None = None
    done_received: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # None: the server did not report it
    output_events: int = 0
    # Arrival of every output event, in microseconds after t_first: the raw stream timing, from which the
    # largest gap (a stall) is read independently of TPOT.
    output_offsets_us: list[int] = field(default_factory=list)
    # How long the client's own event loop was late during the request's longest wait (harness.bench.loop_lag);
    # None: not measured. A stall is the client's only when this shows it.
    client_late_s: float | None = None
    failure: str | None = None  # one of FAILURE_CLASSES, None on success
    error: str | None = None
    tags: dict = field(default_factory=dict)  # dataset/run context: phase, concurrency, session, turn...

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first_ns is None else (self.t_first_ns - self.t0_ns) / 1e9

    @property
    def e2e_s(self) -> float | None:
        return None if self.t_end_ns is None or not self.done_received else (self.t_end_ns - self.t0_ns) / 1e9

    @property
    def tpot_s(self) -> float | None:
        n = self.completion_tokens
        if n is None or n < 2 or self.t_first_ns is None or self.t_last_ns is None:
            return None
        return (self.t_last_ns - self.t_first_ns) / 1e9 / (n - 1)

    @property
    def output_gaps_s(self) -> list[float]:
        """The interval between each two consecutive output events: ITL's samples, and what a stall is read
        from. They sum to t_last - t_first (to the microsecond of `output_offsets_us`), TPOT's numerator."""
        o = self.output_offsets_us
        return [(b - a) / 1e6 for a, b in zip(o, o[1:])]

    @property
    def max_gap_s(self) -> float | None:
        """Largest interval between two consecutive output events; None with fewer than two."""
        gaps = self.output_gaps_s
        return max(gaps) if gaps else None

    @property
    def median_gap_s(self) -> float | None:
        gaps = sorted(self.output_gaps_s)
        return gaps[len(gaps) // 2] if gaps else None

    @property
    def output_tps(self) -> float | None:
        tpot = self.tpot_s
        return None if not tpot else 1.0 / tpot

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(ok=self.ok, ttft_s=self.ttft_s, e2e_s=self.e2e_s, tpot_s=self.tpot_s, output_tps=self.output_tps,
                 max_gap_s=self.max_gap_s)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "RequestRecord":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class ClientConfig:
    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 600.0  # whole request
    stall_timeout_s: float = 120.0  # longest silence between two stream reads


UNAUTHORIZED = 401
API_KEY_FIX = ("the server wants an API key (it was started with --api-key): give it with --api-key KEY, or set "
               "OPENAI_API_KEY")


def status_error(status: int, text: str) -> str:
    """A non-200 answer, as a record's error says it: a missing or wrong key names how to give one."""
    if status == UNAUTHORIZED:
        return f"HTTP 401: {API_KEY_FIX}; it answered: {text[:300]}"
    return f"HTTP {status}: {text[:500]}"


def endpoint_for(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def _has_output(choice: dict) -> bool:
    delta = choice.get("delta")
    if delta is None:  # legacy completions
        return bool(choice.get("text"))
    return bool(
        delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content") or delta.get("tool_calls")
    )


def make_http_client(cfg: ClientConfig, max_connections: int = 256) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    return httpx.AsyncClient(
        base_url=cfg.base_url,
        headers=headers,
        timeout=httpx.Timeout(cfg.timeout_s, read=cfg.stall_timeout_s),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
    )


async def stream_request(
    http: httpx.AsyncClient, cfg: ClientConfig, body: dict, request_id: str, tags: dict | None = None
) -> RequestRecord:
    """Send `body` streaming with usage, return its record; never raises for a server-side failure."""
    body = {**body, "model": body.get("model", cfg.model), "stream": True,
            "stream_options": {**body.get("stream_options", {}), "include_usage": True}}
    endpoint = endpoint_for(body)
    rec = RequestRecord(request_id=request_id, endpoint=endpoint, tags=dict(tags or {}))
    try:
        await asyncio.wait_for(_stream_into(http, endpoint, body, rec), timeout=cfg.timeout_s)
    except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
        _fail(rec, "timeout", f"no complete answer within the timeout ({type(exc).__name__})")
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError, httpx.WriteError) as exc:
        _fail(rec, "disconnect", f"{type(exc).__name__}: {exc}")
    except httpx.HTTPError as exc:
        _fail(rec, "disconnect", f"{type(exc).__name__}: {exc}")
    if rec.t_end_ns is None:
        rec.t_end_ns = time.monotonic_ns()
    if rec.failure is None:
        _classify_completed(rec)
    return rec


async def _stream_into(http: httpx.AsyncClient, endpoint: str, body: dict, rec: RequestRecord) -> None:
    payload = json.dumps(body).encode()

    async def trace(event: str, info: dict) -> None:
        if event.endswith("send_request_headers.started"):
            rec.t0_ns = time.monotonic_ns()  # the last attempt's, if httpcore retried on a stale connection

    rec.t_call_ns = rec.t0_ns = time.monotonic_ns()  # fallback for transports without the trace hook
    async with http.stream("POST", endpoint, content=payload, headers={"Content-Type": "application/json"},
                           extensions={"trace": trace}) as resp:
        rec.http_status = resp.status_code
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            _fail(rec, "http_status", status_error(resp.status_code, text))
            return
        async for line in resp.aiter_lines():
            now = time.monotonic_ns()
            if not line.startswith("data:"):
                continue  # blank separators, comments, `event:` lines
            data = line[5:].strip()
            if data == "[DONE]":
                rec.done_received = True
                rec.t_end_ns = now
                return
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                _fail(rec, "stream_error", f"unparseable SSE data: {data[:200]}")
                return
            if "error" in chunk or chunk.get("object") == "error":
                err = chunk.get("error", chunk)
                _fail(rec, "stream_error", f"in-band error event: {json.dumps(err)[:500]}")
                return
            if chunk.get("choices"):
                if rec.t_first_chunk_ns is None:
                    rec.t_first_chunk_ns = now
                rec.t_last_chunk_ns = now
            for choice in chunk.get("choices") or ():
                if _has_output(choice):
                    if rec.t_first_ns is None:
                        rec.t_first_ns = now
                    rec.t_last_ns = now
                    rec.output_events += 1
                    rec.output_offsets_us.append((now - rec.t_first_ns) // 1000)
                if choice.get("finish_reason") is not None:
                    rec.finish_reason = choice["finish_reason"]
            usage = chunk.get("usage")
            if usage:
                rec.prompt_tokens = usage.get("prompt_tokens")
                rec.completion_tokens = usage.get("completion_tokens")
                details = usage.get("prompt_tokens_details") or {}
                rec.cached_tokens = details.get("cached_tokens")
    # The body ended without `[DONE]`: the server or the network dropped the stream.
    _fail(rec, "disconnect", "stream ended without [DONE]")


def _classify_completed(rec: RequestRecord) -> None:
    if rec.finish_reason not in SUCCESS_FINISH_REASONS:
        _fail(rec, "stream_error", f"finish_reason {rec.finish_reason!r} is not one of stop/length/tool_calls")
    elif rec.completion_tokens is None:
        _fail(rec, "usage_missing", "no usage in the final chunk (stream_options.include_usage ignored?)")
    elif rec.completion_tokens < 1 or rec.t_first_ns is None:
        _fail(rec, "empty_output", f"completion_tokens={rec.completion_tokens}, output events={rec.output_events}")


def _fail(rec: RequestRecord, failure: str, error: str) -> None:
    if rec.failure is None:
        rec.failure = failure
        rec.error = error
        rec.t_end_ns = rec.t_end_ns or time.monotonic_ns()
