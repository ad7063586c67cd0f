"""The CPU suites, run by pytest in a subprocess so their result is exactly what `make test` would say."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from . import names
from .checks import Context, presubmit_check

# tests/patches holds the plugin's unit tests and its on/off equivalence on the tiny server.
OFFLINE_SUITES = ("tests/unit", "tests/numerics", "tests/patches")
SERVER_SUITES = ("tests/api_conformance",)


def server_available(ctx: Context) -> tuple[bool, str]:
    if ctx.server_url:
        return True, f"--server-url {ctx.server_url}"
    if importlib.util.find_spec("vllm") is not None:
        return True, "the embedded tiny vLLM CPU server"
    return False, "no vLLM installed and no --server-url"


def _run(cmd: list[str], ctx: Context) -> tuple[int, list[str]]:
    env = {**os.environ, "OPENAI_API_KEY": ctx.api_key} if ctx.api_key else None  # pytest's --api-key default
    proc = subprocess.run(cmd, cwd=ctx.root, capture_output=True, text=True, env=env)
    return proc.returncode, [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]


@presubmit_check(names.SUITES)
def check_suites(ctx: Context, workers: str = "auto") -> tuple[bool, str]:
    ok, server = server_available(ctx)
    suites = [s for s in OFFLINE_SUITES + (SERVER_SUITES if ok else ()) if (ctx.root / s).exists()]
    marker = "not gpu" if ok else "not gpu and not server"
    extra = ["--server-url", ctx.server_url] if ctx.server_url else []
    # As `make test`: the parallel suite, then the tests that assert on wall-clock time, alone.
    phases = [
        [sys.executable, "-m", "pytest", "-q", "-n", workers, "-m", f"{marker} and not timing",
         "-p", "no:cacheprovider", *suites, *extra],
        [sys.executable, "-m", "pytest", "-q", "-m", f"{marker} and timing", "-p", "no:cacheprovider",
         *suites, *extra],
    ]
    where = f"{', '.join(suites)} with {server}" if ok else f"{', '.join(suites)}; API conformance not run: {server}"
    summaries = []
    for cmd in phases:
        code, lines = _run(cmd, ctx)
        summary = lines[-1].strip("= ") if lines else "(no pytest output)"
        if code not in (0, 5):  # 5: a phase with no test selected (e.g. no timing test in these suites)
            failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))][:3]
            return False, f"{summary} ({where}); {'; '.join(failed)}; rerun: {' '.join(cmd[2:])}"
        summaries.append(summary)
    return True, f"{' + '.join(summaries)} ({where})"
