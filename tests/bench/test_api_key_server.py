"""A server that wants a key (vLLM's --api-key, as a deployment may be started): without the key its requests get
401 and the harness says how to give one; with it (`--api-key`, default $OPENAI_API_KEY) the suites run by URL
pass. The keyed server is harness.gates.servers' no-cache, started with the session's key."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from harness.bench.run import list_models
from harness.bench.client import API_KEY_FIX, ClientConfig, make_http_client, stream_request
from harness.errors import HarnessError
from harness.gates.servers import NO_CACHE, exclusive
from harness.paths import REPO_ROOT

pytestmark = [pytest.mark.server, pytest.mark.slow]

# A few by-URL tests of two suites: the bench client's, and the API conformance checks that need no snapshot.
BY_URL = ["tests/bench/test_live_bench.py::test_real_server_streams_output_and_reports_usage_with_cached_tokens",
          "tests/api_conformance/test_request_corpus.py", "--target-name", "tiny-cpu",
          "-k", "streams_output or (semantics and (chat_plain or chat_stream or completions_plain "
                "or bad_unknown_model))"]


def nested_pytest(url: str, key: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "OPENAI_API_KEY"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *BY_URL,
           "--server-url", url] + (["--api-key", key] if key else [])
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_without_the_key_requests_get_401_and_the_harness_names_the_fix(compared_servers):
    server = compared_servers[NO_CACHE]
    with pytest.raises(HarnessError, match="answered 401") as err:
        list_models(server.base_url, None)
    assert API_KEY_FIX in str(err.value)

    async def one():
        cfg = ClientConfig(server.base_url, server.model, None, timeout_s=60)
        async with make_http_client(cfg) as http:
            return await stream_request(http, cfg, {"messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": 2}, "no-key")

    rec = asyncio.run(one())
    assert rec.failure == "http_status" and rec.http_status == 401 and API_KEY_FIX in rec.error

    done = nested_pytest(server.base_url, None)
    assert done.returncode != 0, done.stdout[-3000:]
    assert API_KEY_FIX in done.stdout, done.stdout[-3000:]  # one line that names the fix, not a traceback
    assert "Traceback" not in done.stdout, done.stdout[-3000:]


def test_with_the_key_the_suites_pass_by_url(compared_servers):
    server = compared_servers[NO_CACHE]
    with exclusive(server):  # the MoE test's sequential requests go alone
        done = nested_pytest(server.base_url, server.api_key)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-3000:]
