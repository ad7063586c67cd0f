"""Headless Chromium driven over the DevTools protocol, for the history page's browser test.

Debian's `chromium` package (CI installs it); no Selenium or Playwright: one websocket to the page target, three
protocol calls (navigate, evaluate, screenshot). The flags are the ones this kind of machine needs offline: no
sandbox as root, no GPU, and no background networking (Chromium otherwise keeps trying to reach its own hosts).
"""
from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

PACKAGE = "chromium"  # Debian's package name: `apt-get install chromium`
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,900")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    def __init__(self, executable: str, start_timeout_s: float = 60.0):
        self.executable, self.start_timeout_s = executable, start_timeout_s
        self._ids = itertools.count(1)

    def __enter__(self) -> "Chromium":
        from websockets.sync.client import connect

        self._profile = tempfile.TemporaryDirectory(prefix="qwen36-chromium-")
        self.proc = subprocess.Popen([self.executable, *FLAGS, "--remote-debugging-port=0",
                                      f"--user-data-dir={self._profile.name}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            port = self._devtools_port()
            targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
            page = next(t for t in targets if t.get("type") == "page")
            self._ws_context = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
            self.ws = self._ws_context.__enter__()
            self.call("Page.enable")
            self.call("Runtime.enable")
        except BaseException:
            self._kill()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._ws_context.__exit__(*exc)
        finally:
            self._kill()

    def _kill(self) -> None:
        # Chromium starts a tree (zygote, renderers): end the whole process group, even on failure.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._profile.cleanup()

    def _devtools_port(self) -> int:
        marker = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if marker.exists() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.executable} exited ({self.proc.returncode}): "
                                   f"{self.proc.stderr.read().decode(errors='replace')[-1500:]}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.executable} did not open its DevTools port in {self.start_timeout_s:.0f} s")

    def call(self, method: str, **params) -> dict:
        ident = next(self._ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0):
        """Evaluate until it gives a truthy value; returns it (raises TimeoutError with the last value)."""
        deadline, value = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:  # the page is between documents
                value = None
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"after {timeout_s:.0f} s, {expression[:120]!r} is still {value!r}")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

