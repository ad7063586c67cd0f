"""`python -m harness.suite_session -- CMD [-- CMD ...]`: `make test`'s pytest runs under one embedded server.

`make test` runs the suite twice: in parallel, then the `timing` tests alone. Each pytest session used to
start its own embedded server (about two minutes on two cores, most of it torch.compile), and the timing
run more, the servers the perf gates compare with it (harness.gates.servers). This owner starts them all
in the background as soon as it begins (the session's first, then the others), then warms
the servers the timing run's gates measure (their prefix caches, harness.gates.measure), so the parallel
run's other tests proceed meanwhile (tests/conftest.py orders the tests that need the session's server
last) and the timing run finds them up and warm; both runs share them through `harness.serving.shared_server`, and
they are ended here, when the last command is done, on failure or Ctrl-C too.

The commands run in order; the first that fails stops the rest and gives its exit code. The first runs
while the servers start; each later one waits until every start and warm-up is over, as it measures time (a
start beside a measurement slowed the perf gates' control by 40%). With `--server-url` in a command nothing
is started: that run measures the server it names.

An entry point beside the CLI, not part of `harness.serving`: it starts the gates' servers too, and `gates`
builds on `serving`.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from harness.serving import shared_server
from harness.gates.reference import prune_worktrees
from harness.gates.servers import (MOE_ON, MOE_ON_COMPILED, NO_CACHE, REFERENCE, TWIN, acquire_compared,
                                   acquire_reference, warm_for_gates)
from harness.serving.health import dead_server_reports
from harness.serving.shared_server import OWNER_ENV, SESSION, STATE_ENV, ServerInfo

USAGE = "usage: python -m harness.suite_session [--compared NAME,...] -- CMD [ARG...] [-- CMD [ARG...]]..."


def split_commands(argv: list[str]) -> list[list[str]]:
    """`-- a b -- c d` -> [[a, b], [c, d]]; empty commands are refused."""
    if not argv or argv[0] != "--":
        raise SystemExit(f"{USAGE}\n(the commands start after `--`)")
    commands: list[list[str]] = [[]]
    for word in argv[1:]:
        if word == "--":
            commands.append([])
        else:
            commands[-1].append(word)
    if any(not c for c in commands):
        raise SystemExit(f"{USAGE}\n(an empty command between `--` separators)")
    return commands


def _say(message: str) -> None:
    print(f"suite_session: {message}", file=sys.stderr, flush=True)


Start = Callable[[Path], tuple]  # state_dir -> (ManagedServer, model_dir), as shared_server.acquire takes
Then = Callable[[Path, ServerInfo], object]  # what to start once the session's server is up


PARALLEL_RUN_SERVERS = (NO_CACHE, MOE_ON, MOE_ON_COMPILED)
TIMING_RUN_SERVERS = (TWIN, REFERENCE)


def _acquire(state_dir: Path, model_dir: str, name: str) -> ServerInfo | None:
    """One compared server, or None when it did not start (recorded in its state file: the tests that need it
    report why, with its log)."""
    try:
        if name == REFERENCE:
            return acquire_reference(state_dir, model_dir)
        return acquire_compared(state_dir, model_dir, (name,))[name]
    except Exception as exc:
        _say(f"the {name} server did not start: {str(exc).splitlines()[0]}")
        return None


def compared_names(argv: list[str]) -> tuple[tuple[str, ...] | None, list[str]]:
    """(the compared servers `--compared a,b` names, or None for all of them; the rest of argv)."""
    if argv[:1] != ["--compared"]:
        return None, argv
    if len(argv) < 2:
        raise SystemExit(f"{USAGE}\n(--compared takes a comma-separated list of names)")
    names = tuple(n for n in argv[1].split(",") if n)
    unknown = sorted(set(names) - set(PARALLEL_RUN_SERVERS + TIMING_RUN_SERVERS))
    if unknown:
        raise SystemExit(f"{USAGE}\n(no compared server {unknown}; the known ones: "
                         f"{list(PARALLEL_RUN_SERVERS + TIMING_RUN_SERVERS)})")
    return names, argv[2:]


def _start_compared(state_dir: Path, session: ServerInfo, only: tuple[str, ...] | None = None) -> None:
    """The servers the perf gates compare with the session's (harness.gates.servers; `only` those), then their
    warm-ups."""
    servers = {SESSION: session}
    # Two at a time (memory, and two cores): first those the parallel run's tests use, then those of the timing run.
    for names in PARALLEL_RUN_SERVERS, TIMING_RUN_SERVERS:
        names = tuple(n for n in names if only is None or n in only)
        with ThreadPoolExecutor(max_workers=2) as pool:
            started = {name: pool.submit(_acquire, state_dir, session.model_dir, name) for name in names}
        servers.update({name: f.result() for name, f in started.items() if f.result() is not None})
    if only is not None and not set(only) & set(TIMING_RUN_SERVERS):
        _say(f"the compared servers are up ({', '.join(sorted(servers))}); no timing run's server: nothing to warm")
        return
    _say(f"the compared servers are up ({', '.join(sorted(servers))}); warming the gates' servers "
         f"(bench output in {state_dir}/warmups.log)")
    # The bench prints its tables on stdout; the pytest run's output is the console's.
    try:
        with open(state_dir / "warmups.log", "a") as log, contextlib.redirect_stdout(log):
            done = warm_for_gates(servers, state_dir / "warmups")
    except Exception as exc:  # the timing run's tests warm what is not marked warm, and report a broken server
        _say(f"a warm-up failed ({exc}); the tests that need it will warm the server themselves")
        return
    _say(f"warmed: {', '.join(done) or 'nothing left to warm'}")


def _start_in_background(state_dir: Path, start_server: Start, then: Then | None) -> threading.Thread:
    began = time.monotonic()

    def start() -> None:
        try:
            session = shared_server.acquire(state_dir, start_server)
            _say(f"the session's server is up after {time.monotonic() - began:.0f} s")
            if then is not None:
                then(state_dir, session)
                _say(f"the servers started after it are up and warm, {time.monotonic() - began:.0f} s from the start")
        except Exception as exc:  # recorded in its state file by acquire(); the tests report it with the log
            _say(f"a server did not start: {exc}")

    thread = threading.Thread(target=start, name="embedded-server-start", daemon=True)
    thread.start()
    return thread


def run(commands: list[list[str]], start_server: Start = shared_server.start_embedded,
        then: Then | None = _start_compared) -> int:
    wants_server = not any(word.startswith("--server-url") for c in commands for word in c)
    state_dir = Path(tempfile.mkdtemp(prefix="qwen36-suite-"))
    ours = {STATE_ENV: str(state_dir), OWNER_ENV: str(os.getpid())}
    before = {k: os.environ.get(k) for k in ours}
    os.environ.update(ours)  # the commands inherit it; start_embedded reads the owner from it
    # SIGTERM (a CI runner cancelling the job) ends the server too: turned into SystemExit, so `finally` runs.
    previous_handler = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        starting = _start_in_background(state_dir, start_server, then) if wants_server else None
        for i, command in enumerate(commands):
            if i and starting is not None:
                waited = time.monotonic()
                starting.join()  # the later runs measure time: no server may still be starting beside them
                _say(f"command {i + 1} waited {time.monotonic() - waited:.0f} s for the server starts")
            code = subprocess.call(command)
            if code != 0:
                return code
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        for report in dead_server_reports(state_dir):  # its log goes with the state directory
            _say(report)
        # A start still in progress has no state file yet; the server's watchdog ends it once this
        # process (its owner) has exited.
        shared_server.release(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
        prune_worktrees()  # the reference's checkout went with the state directory
        signal.signal(signal.SIGTERM, previous_handler)
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: list[str] | None = None) -> int:
    only, rest = compared_names(sys.argv[1:] if argv is None else argv)
    then = _start_compared if only is None else (lambda state_dir, session: _start_compared(state_dir, session, only))
    return run(split_commands(rest), then=then)


if __name__ == "__main__":
    sys.exit(main())
