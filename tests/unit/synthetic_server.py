"""A synthetic OpenAI streaming server for measurement-truth tests: it emits SSE events at scheduled offsets
and records when it actually sent each one (same process, same monotonic clock as the client).

It runs in its own process so that neither the GIL nor the client's work delays an emission; Linux's
CLOCK_MONOTONIC is system-wide, so its timestamps compare with the client's. `GET /_served` returns the
record of every request served; `GET /v1/models` lists the scenarios. A request picks its scenario by its `model`
field. A scenario is an HTTP status plus a list of steps
(offset_s, action): action is a chunk dict, pre-encoded SSE bytes, "[DONE]", "DROP" (abort the TCP connection), "STALL" (go
silent for good) or "END" (close the stream cleanly, without [DONE]).
Written on raw asyncio streams so a test controls every byte and every disconnect.
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from dataclasses import asdict, dataclass, field

import httpx


@dataclass
class Scenario:
    steps: list[tuple[float, object]] = field(default_factory=list)
    status: int = 200
    error_body: dict | None = None


@dataclass
class Served:
    scenario: str
    received_ns: int
    sent_ns: list[int] = field(default_factory=list)  # one per step actually written


def chunk(content=None, *, role=None, reasoning=None, tool_calls=None, finish_reason=None) -> dict:
    delta = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning"] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {"id": "chatcmpl-synthetic", "object": "chat.completion.chunk", "model": "synthetic",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def usage(prompt: int, completion: int, cached: int | None = 0) -> dict:
    u = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": "chatcmpl-synthetic", "object": "chat.completion.chunk", "model": "synthetic", "choices": [],
            "usage": u}


def normal_stream(ttft_s: float, gap_s: float, tokens: int, prompt: int = 100, cached: int | None = 40,
                  finish: str = "length") -> Scenario:
    """Role-only chunk at 0, first token at ttft_s, one token every gap_s, usage, [DONE]."""
    steps: list[tuple[float, object]] = [(0.0, chunk(role="assistant", content=""))]
    for i in range(tokens):
        steps.append((ttft_s + i * gap_s, chunk(f"t{i}")))
    last = ttft_s + (tokens - 1) * gap_s
    steps += [(last, chunk(finish_reason=finish)), (last, usage(prompt, tokens, cached)), (last, "[DONE]")]
    return Scenario(steps)


class SyntheticServer:
    """Runs on 127.0.0.1 in a child process; `url` once entered. `cpu` pins the child to one core; `api_key`: answer
    401 to a request without `Authorization: Bearer KEY`, as vLLM started with --api-key does on /v1."""

    def __init__(self, scenarios: dict[str, Scenario], cpu: int | None = None, api_key: str | None = None):
        self.scenarios = scenarios
        self.cpu = cpu
        self.port: int | None = None
        ctx = multiprocessing.get_context("spawn")  # a clean interpreter: no inherited threads or loops
        self._ports = ctx.Queue()
        self._proc = ctx.Process(target=_serve_forever, args=(scenarios, cpu, self._ports, api_key), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def served(self) -> list[Served]:
        return [Served(**d) for d in httpx.get(self.url + "/_served", timeout=10).json()]

    def __enter__(self) -> "SyntheticServer":
        self._proc.start()
        self.port = self._ports.get(timeout=60)
        return self

    def __exit__(self, *exc) -> None:
        self._proc.terminate()
        self._proc.join(timeout=10)


def _serve_forever(scenarios: dict[str, Scenario], cpu: int | None, ports, api_key: str | None = None) -> None:
    import os

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    asyncio.run(_Handler(scenarios, api_key).main(ports))


class _Handler:
    def __init__(self, scenarios: dict[str, Scenario], api_key: str | None = None):
        self.scenarios = scenarios
        self.api_key = api_key
        self.served: list[Served] = []

    async def main(self, ports) -> None:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        ports.put(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: several requests per connection
                head = await reader.readuntil(b"\r\n\r\n")
                received_ns = time.monotonic_ns()
                lines = head.decode().split("\r\n")
                length = 0
                for line in lines:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = json.loads(await reader.readexactly(length)) if length else {}
                if self.api_key and " /v1/" in lines[0] and f"authorization: bearer {self.api_key.lower()}" not in \
                        [line.lower() for line in lines]:
                    payload = b'{"error": "Unauthorized"}'
                    writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
                    await writer.drain()
                    continue
                if lines[0].startswith("GET /_served"):
                    payload = json.dumps([asdict(s) for s in self.served]).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
                    await writer.drain()
                    continue
                if lines[0].startswith("GET /v1/models"):  # the scenarios, as the models a client may name
                    payload = json.dumps({"data": [{"id": name} for name in self.scenarios]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
                    await writer.drain()
                    continue
                if lines[0].startswith("GET "):  # /metrics, /version, ...: not served here
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                if not await self.respond(body, received_ns, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def respond(self, body: dict, received_ns: int, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection must not be reused."""
        name = body.get("model", "")
        rec = Served(name, received_ns)
        self.served.append(rec)
        sc = self.scenarios[name]
        if sc.status != 200:
            payload = json.dumps(sc.error_body or {"error": {"message": "synthetic", "type": "X"}}).encode()
            writer.write(f"HTTP/1.1 {sc.status} Error\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        start = received_ns / 1e9
        for offset, action in sc.steps:
            delay = start + offset - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if action == "DROP":
                writer.transport.abort()
                return False
            if action == "STALL":
                await asyncio.sleep(3600)
            if action == "END":
                break
            if isinstance(action, bytes):  # pre-encoded SSE events, written as they are (throughput tests)
                event = action
            else:
                data = action if isinstance(action, str) else json.dumps(action)
                event = f"data: {data}\n\n".encode()
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            await writer.drain()
            rec.sent_ns.append(time.monotonic_ns())
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
