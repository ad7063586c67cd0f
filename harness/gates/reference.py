"""The performance reference commit: a committed pointer, its checkout, and its server started by its own code.

CI's slower-commit gate (tests/perf_gates/test_gate_paired.py) measures HEAD's server against the reference
commit's, interleaved (harness.gates.interleave), each with the server configuration its own code produces: the
reference's server is started by the reference's own `qwen36 serve`, run in a git worktree of that commit with
the worktree's `harness`, `patches` and `model` first on the path, on the same model files and in the same
virtual environment. So the two must ask for the same dependencies: where pyproject.toml's differ, the
reference cannot run in HEAD's environment, and the gate fails naming the command that moves the pointer.

Moving the reference is one command and a commit:

    qwen36 reference move            # to HEAD (or: qwen36 reference move REV)
    git commit fixtures/gates/reference.yaml -m "perf reference: ..."
"""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from harness.serving import watchdog
from harness.errors import HarnessError, ServerDied
from harness.paths import REFERENCE_FILE, REPO_ROOT
from harness.serving.placement import plan_layout
from harness.serving.launcher import DEFAULT_SERVED_NAME, log_tail, terminate_tree, until_signalled
from harness.serving.shared_server import ServerInfo

MOVE_COMMAND = "qwen36 reference move"
# pyproject.toml's fields that decide what the environment holds.
_DEPENDENCY_FIELDS = ("requires-python", "dependencies", "optional-dependencies")
# The extras `make venv` installs (the Makefile's `EXTRAS := test,server,history`), the environment the reference's server runs
# in: only these can make it unrunnable. An extra that environment never installs (`gpu`, `gpu-test`) changes
# nothing there, so adding one needs no move of the reference. tests/unit/test_gate_reference_dependencies.py
# holds this equal to the Makefile's.
ENVIRONMENT_EXTRAS = ("test", "server", "history")
_READY = re.compile(r"^ready: (http://\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Reference:
    commit: str
    moved: str  # when the pointer was moved (UTC date)
    note: str = ""


def load_reference(path: Path = REFERENCE_FILE) -> Reference:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        return Reference(str(raw["commit"]), str(raw.get("moved", "")), str(raw.get("note", "")))
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise HarnessError(f"performance reference {path}: {exc!r}; it needs `commit: SHA`. Write it with "
                           f"`{MOVE_COMMAND}`") from exc


def _git(*args: str, cwd: Path = REPO_ROOT, check: bool = True) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=check)
    except FileNotFoundError as exc:
        raise HarnessError("git is not installed: the performance reference is a commit of this repository") from exc
    except subprocess.CalledProcessError as exc:
        raise HarnessError(f"`git {' '.join(args)}` failed in {cwd}: {exc.stderr.strip() or exc.stdout.strip()}") \
            from None


def move_reference(rev: str = "HEAD", note: str = "", path: Path = REFERENCE_FILE) -> Reference:
    """Point the reference at `rev` (a commit of this repository); the caller commits the file."""
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}").stdout.strip()
    ref = Reference(commit, dt.datetime.now(dt.timezone.utc).date().isoformat(), note)
    Path(path).write_text(
        "# The performance reference commit: CI's slower-commit gate measures HEAD's server against this commit's,\n"
        "# interleaved (harness/gates/reference.py). Move it with `qwen36 reference move [REV]`, then commit.\n"
        + yaml.safe_dump({"commit": ref.commit, "moved": ref.moved, "note": ref.note}, sort_keys=False))
    return ref


def dependencies(pyproject_text: str) -> dict:
    """What a pyproject asks the server's environment for: Python, the dependencies, the extras it installs."""
    project = tomllib.loads(pyproject_text).get("project", {})
    asked = {name: project.get(name) for name in _DEPENDENCY_FIELDS}
    extras = asked["optional-dependencies"] or {}
    asked["optional-dependencies"] = {name: extras.get(name) for name in ENVIRONMENT_EXTRAS}
    return asked


def dependency_differences(commit: str, root: Path = REPO_ROOT) -> list[str]:
    """How the reference's pyproject.toml asks for other dependencies than this checkout's (empty: the same)."""
    theirs = dependencies(_git("show", f"{commit}:pyproject.toml", cwd=root).stdout)
    ours = dependencies((Path(root) / "pyproject.toml").read_text())
    return [f"{name}: reference {theirs[name]!r}, HEAD {ours[name]!r}" for name in _DEPENDENCY_FIELDS
            if theirs[name] != ours[name]]


def check_dependencies(ref: Reference, root: Path = REPO_ROOT) -> None:
    diffs = dependency_differences(ref.commit, root)
    if diffs:
        raise HarnessError(
            f"the performance reference {ref.commit[:12]} asks for other dependencies than HEAD ({'; '.join(diffs)}): "
            f"its server cannot run in HEAD's environment. Move the reference past the change: `{MOVE_COMMAND}` "
            "and commit fixtures/gates/reference.yaml")


def add_worktree(ref: Reference, dest: Path, root: Path = REPO_ROOT) -> Path:
    """The reference commit checked out at `dest` (detached); remove it with `remove_worktree`."""
    if _git("cat-file", "-e", f"{ref.commit}^{{commit}}", cwd=root, check=False).returncode != 0:
        raise HarnessError(
            f"the performance reference {ref.commit} is not in this clone (a shallow clone, or a commit that was "
            f"never pushed): fetch it (`git fetch --unshallow` or `git fetch origin {ref.commit}`), or move the "
            f"reference to a commit of this history (`{MOVE_COMMAND}`)")
    _git("worktree", "add", "--detach", "--force", str(dest), ref.commit, cwd=root)
    return Path(dest)


def remove_worktree(dest: Path, root: Path = REPO_ROOT) -> None:
    _git("worktree", "remove", "--force", str(dest), cwd=root, check=False)
    prune_worktrees(root)


def prune_worktrees(root: Path = REPO_ROOT) -> None:
    """Forget worktrees whose directory is gone (a test session's, removed with its state directory)."""
    try:
        _git("worktree", "prune", cwd=root, check=False)
    except HarnessError:  # no git: nothing was added either
        pass


@dataclass
class ReferenceServer:
    """The reference's `qwen36 serve`, run in its worktree, and what it printed."""
    worktree: Path
    run_dir: Path
    model_dir: Path
    owner_pid: int | None = None
    ready_timeout_s: float = 900.0
    proc: subprocess.Popen | None = None

    @property
    def output_path(self) -> Path:
        return self.run_dir / "serve.out"

    def start(self) -> ServerInfo:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(self.worktree)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
        cmd = [sys.executable, "-m", "harness.cli", "serve", "--model", str(self.model_dir),
               "--run-dir", str(self.run_dir)]
        with open(self.output_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=self.worktree, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        # Ends `serve` (which ends its vLLM server) when the owner dies without a teardown.
        watchdog.start(self.owner_pid or os.getpid(), self.proc.pid)
        try:
            url = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        layout = plan_layout()
        return ServerInfo(url, DEFAULT_SERVED_NAME, self.proc.pid, str(self.run_dir / "server.log"),
                          self._vllm_command(), str(self.model_dir), layout.frontend if layout else None)

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            text = self.output_path.read_text(errors="replace")
            found = _READY.search(text)
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise ServerDied(f"the reference's `qwen36 serve` exited with code {self.proc.returncode} before it "
                                 f"was ready; its output ({self.output_path}):\n{log_tail(self.output_path)}")
            time.sleep(1.0)
        raise ServerDied(f"the reference's server was not ready after {self.ready_timeout_s:.0f} s; its output "
                         f"({self.output_path}):\n{log_tail(self.output_path)}")

    def _vllm_command(self) -> str | None:
        """The vLLM command its server log starts with (`$ ...`), as the embedded server writes it."""
        try:
            first = (self.run_dir / "server.log").read_text(errors="replace").splitlines()[0]
        except (OSError, IndexError):
            return None
        return first[2:] if first.startswith("$ ") else None

    def stop(self) -> None:
        if self.proc is not None:
            terminate_tree(self.proc.pid)  # SIGTERM: `serve` stops its server cleanly
            self.proc = None


@contextlib.contextmanager
def reference_and_head(work_dir: Path) -> Iterator[list[ServerInfo]]:
    """The reference commit's server and this checkout's, on one tiny model built here, warmed to the prefix
    cache's steady state; both ended when the block ends (`qwen36 ab` without URLs)."""
    from harness.gates.measure import STEADY_PREFIX_CACHE, warm
    from harness.serving.launcher import embedded_server
    from harness.serving.shared_server import SESSION_KV_GIB, info_of
    from harness.serving.tiny_model import build_tiny_model

    ref = load_reference()
    check_dependencies(ref)
    work_dir = Path(work_dir)
    model_dir = build_tiny_model(work_dir / "tiny-model")
    worktree = add_worktree(ref, work_dir / f"reference-{ref.commit[:12]}")
    reference, head = ReferenceServer(worktree, work_dir / "reference", model_dir), None
    try:
        print(f"starting the reference {ref.commit[:12]}'s server and this checkout's (a few minutes)", file=sys.stderr)
        servers = [reference.start()]
        head = embedded_server(work_dir / "head", model_dir, cpu_kvcache_gib=SESSION_KV_GIB).start()
        servers.append(info_of(head, str(model_dir)))
        for server in servers:
            warm(server, STEADY_PREFIX_CACHE, work_dir / "warm")
        yield servers
    finally:
        if head is not None:
            head.stop()
        reference.stop()
        remove_worktree(worktree)


def serve_reference_until_stopped(ref: Reference, model_dir: Path | None, work_dir: Path) -> int:
    """`qwen36 reference serve`: the reference's server on this machine until Ctrl-C, for a hand A/B."""
    check_dependencies(ref)
    worktree = add_worktree(ref, work_dir / "worktree")
    server = None
    try:
        if model_dir is None:
            from harness.serving.tiny_model import build_tiny_model

            model_dir = build_tiny_model(work_dir / "tiny-model")
        server = ReferenceServer(worktree, work_dir / "serve", Path(model_dir))
        info = server.start()
        announce = lambda: print(f"reference {ref.commit[:12]} ready: {info.base_url}  (Ctrl-C stops it)",  # noqa: E731
                                 flush=True)
        return 0 if until_signalled(lambda: server.proc is not None and server.proc.poll() is None, announce) else 1
    except KeyboardInterrupt:
        return 0
    finally:
        if server is not None:
            server.stop()
        remove_worktree(worktree)
