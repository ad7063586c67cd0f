"""`qwen36 history serve`: the published page on a loopback port (asv's page loads its data over HTTP, not file://)."""
from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from pathlib import Path
from typing import Iterator

from harness.errors import HarnessError


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per request would bury the address
        pass


def _server(site: Path, port: int) -> http.server.ThreadingHTTPServer:
    if not (Path(site) / "index.html").is_file():
        raise HarnessError(f"{site} has no index.html: build it first with `qwen36 history publish {site}`")
    handler = functools.partial(_Quiet, directory=str(site))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise HarnessError(f"cannot listen on 127.0.0.1:{port} ({exc}); pick another with --port") from exc


@contextlib.contextmanager
def serving(site: Path, port: int = 0) -> Iterator[str]:
    """Serve `site` in a background thread for the duration of the block; yields its base URL."""
    server = _server(site, port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def serve_until_interrupted(site: Path, port: int = 8765) -> None:
    server = _server(site, port)
    print(f"history page: http://127.0.0.1:{server.server_address[1]}/  (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
