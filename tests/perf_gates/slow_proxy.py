"""A loopback TCP proxy that spaces out the server's stream events: an injected decode slowdown.

Byte-level, so HTTP framing and keep-alive pass through untouched; in the server-to-client direction it
forwards up to the end of each SSE event (a blank line) and then waits `delay_s`, the way a slower decode
step would space tokens out. (Delaying per read instead would coalesce events into bursts and make the
stream look faster.)
"""
from __future__ import annotations

import asyncio
import threading
from urllib.parse import urlparse


class SlowProxy:
    def __init__(self, upstream_url: str, delay_s: float):
        target = urlparse(upstream_url)
        self.upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self.delay_s = delay_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self.url = ""

    async def _pipe(self, reader, writer, delay_s: float) -> None:
        try:
            while chunk := await reader.read(65536):
                while delay_s and (end := chunk.find(b"\n\n")) >= 0:
                    writer.write(chunk[: end + 2])
                    await writer.drain()
                    await asyncio.sleep(delay_s)
                    chunk = chunk[end + 2 :]
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, client_reader, client_writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(self._pipe(client_reader, up_writer, 0.0),
                             self._pipe(up_reader, client_writer, self.delay_s))

    def __enter__(self) -> "SlowProxy":
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop).result(10)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc) -> None:
        async def shutdown():
            self._server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
