"""A stand-in for a server command in launcher tests: `python fake_openai_server.py PORT MODE`.

MODE `ok` answers chat completions; `key=SECRET` answers only those that carry `Authorization: Bearer SECRET`;
`health-only` answers /health but fails every generation (the vLLM failure the notes describe); all spawn a
grandchild process, as vLLM spawns its engine core.
"""
import json
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port, mode = int(sys.argv[1]), sys.argv[2]
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # the "engine core"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send(200, {"data": [{"id": "fake"}]} if self.path == "/v1/models" else {})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if mode.startswith("key=") and self.headers.get("Authorization") != f"Bearer {mode[4:]}":
            self._send(401, {"error": "Unauthorized"})  # as vLLM started with --api-key answers on /v1
        elif mode == "ok" or mode.startswith("key="):
            self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]})
        else:
            self._send(500, {"error": {"message": "engine dead"}})


print(f"fake server on {port} mode {mode}", flush=True)
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
