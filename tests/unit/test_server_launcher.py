"""The server launcher and the shared session server, with stand-in server commands (no vLLM needed)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from harness.serving import shared_server
from harness.errors import ServerDied
from harness.serving.launcher import ManagedServer, ServerConfig, build_command, terminate_tree, until_signalled

FAKE = str(Path(__file__).with_name("fake_openai_server.py"))


def _cfg(mode: str, **kw) -> ServerConfig:
    return ServerConfig(model="unused", command=(sys.executable, FAKE, "{port}", mode), **kw)


def _tree(pid: int) -> list[psutil.Process]:
    return [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)


def _wait_for_children(pid: int, n: int) -> list[psutil.Process]:
    for _ in range(100):
        procs = _tree(pid)
        if len(procs) >= n + 1:
            return procs
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not spawn {n} children")


def test_vllm_command_carries_platform_flags_and_template():
    cmd = build_command(ServerConfig(model="/m", chat_template=Path("/t.jinja")), 1234)
    joined = " ".join(cmd)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enable-auto-tool-choice", "--tool-call-parser qwen3_coder", "--reasoning-parser qwen3",
                 "--enable-prefix-caching", "--enable-prompt-tokens-details", "--chat-template /t.jinja",
                 "--dtype bfloat16", "--port 1234", "--host 127.0.0.1"):
        assert flag in joined


def test_terminate_tree_ends_grandchildren():
    p = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300 & wait"], start_new_session=True)
    procs = _wait_for_children(p.pid, 2)
    terminate_tree(p.pid, grace_s=5)
    p.wait(timeout=5)
    assert not [q for q in procs if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]


def test_terminate_tree_kills_a_child_that_ignores_sigterm():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(300)"
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"up"
    t = time.monotonic()
    terminate_tree(p.pid, grace_s=0.5)
    assert p.wait(timeout=5) == -9 and time.monotonic() - t < 5


def test_ready_server_answers_and_stop_leaves_no_process(tmp_path):
    with ManagedServer(_cfg("ok"), tmp_path / "server.log") as server:
        procs = _wait_for_children(server.proc.pid, 1)
        assert httpx.get(server.base_url + "/v1/models").status_code == 200
    assert not [q for q in procs if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]
    assert "fake server on" in (tmp_path / "server.log").read_text()


def test_server_that_exits_raises_with_its_log_tail(tmp_path):
    cfg = ServerConfig(model="unused", command=(sys.executable, "-c", "print('boom-marker'); raise SystemExit(3)"))
    with pytest.raises(ServerDied, match=r"(?s)code 3.*boom-marker"):
        ManagedServer(cfg, tmp_path / "server.log").start()


def test_health_only_server_is_not_ready_and_is_cleaned_up(tmp_path):
    server = ManagedServer(_cfg("health-only", ready_timeout_s=3), tmp_path / "server.log")
    with pytest.raises(ServerDied, match="not ready after 3 s.*HTTP 500"):
        server.start()
    assert server.proc is None  # stop() ran


def test_readiness_carries_the_servers_api_key_and_without_it_names_the_401(tmp_path):
    with ManagedServer(_cfg("key=secret", api_key="secret"), tmp_path / "keyed.log") as server:
        assert server.proc.poll() is None
    server = ManagedServer(_cfg("key=secret", ready_timeout_s=3), tmp_path / "keyless.log")
    with pytest.raises(ServerDied, match="not ready after 3 s.*HTTP 401"):
        server.start()


def test_shared_server_starts_once_and_release_ends_it(tmp_path):
    calls = []

    def start(state_dir: Path):
        calls.append(state_dir)
        return shared_server.info_of(ManagedServer(_cfg("ok"), state_dir / "server.log").start(), None)

    first = shared_server.acquire(tmp_path, start)
    second = shared_server.acquire(tmp_path, start)
    assert first == second and len(calls) == 1
    procs = _wait_for_children(first.pid, 1)
    shared_server.release(tmp_path)
    assert not [q for q in procs if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]


def test_shared_server_failure_is_recorded_so_other_workers_fail_fast(tmp_path):
    def start(state_dir: Path):
        raise ServerDied("exited with code 1; log tail: CUDA? no")

    with pytest.raises(ServerDied):
        shared_server.acquire(tmp_path, start)
    with pytest.raises(ServerDied, match="failed to start in another process.*CUDA"):
        shared_server.acquire(tmp_path, lambda d: pytest.fail("must not start again"))
    assert "error" in json.loads((tmp_path / f"{shared_server.SESSION}.json").read_text())


def test_server_is_ended_when_its_owner_is_killed(tmp_path):
    # The owner starts a server and is then SIGKILLed: no teardown runs, the watchdog must end the tree.
    code = (f"import sys, os, time; sys.path.insert(0, {str(Path(__file__).parents[2])!r})\n"
            "from harness.serving.launcher import ManagedServer, ServerConfig\n"
            f"s = ManagedServer(ServerConfig(model='x', command=(sys.executable, {FAKE!r}, '{{port}}', 'ok')), "
            f"{str(tmp_path / 'server.log')!r}).start()\n"
            "print(s.proc.pid, flush=True)\ntime.sleep(300)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    server_pid = int(owner.stdout.readline())
    procs = _wait_for_children(server_pid, 1)
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(q.is_running() and q.status() != psutil.STATUS_ZOMBIE for q in procs):
        time.sleep(0.2)
    assert not [q for q in procs if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]



def test_a_signal_right_after_the_ready_line_reaches_the_serving_handlers():
    # As `qwen36 serve` starts: SIGTERM raises until the server is up. A client that reads "ready" and signals at
    # once must meet until_signalled's handlers, which only ask it to return.
    def raising(*_):
        raise KeyboardInterrupt

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, raising)
    try:
        began = time.monotonic()
        try:
            asked = until_signalled(lambda: True, announce=lambda: os.kill(os.getpid(), signal.SIGTERM))
        except KeyboardInterrupt:
            pytest.fail("the SIGTERM sent on the ready line met the start's handler, not until_signalled's")
        assert asked is True and time.monotonic() - began < 5
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
