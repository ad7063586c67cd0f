"""A run directory: manifest.json, requests.jsonl, summary.json (report.md and plot.png: harness.bench.report)."""
from __future__ import annotations

import datetime as dt
import json
import platform
import socket
import subprocess
from pathlib import Path

import httpx

from harness import __version__
from harness.paths import REPO_ROOT


def new_run_dir(root: Path, label: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{stamp}-{label}"
    n = 1
    while path.exists():
        n += 1
        path = Path(root) / f"{stamp}-{label}-{n}"
    path.mkdir(parents=True)
    return path


def git_commit(repo: Path = REPO_ROOT) -> dict:
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                                  timeout=10).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            return None

    status = git("status", "--porcelain")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status)}


def server_version(base_url: str) -> str | None:
    """vLLM answers GET /version; other servers may not."""
    try:
        r = httpx.get(base_url.rstrip("/") + "/version", timeout=5)
        return r.json().get("version") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def host_info() -> dict:
    import os

    return {"hostname": socket.gethostname(), "platform": platform.platform(), "machine": platform.machine(),
            "python": platform.python_version(), "cpus": os.cpu_count()}


def write_json(path: Path, obj) -> None:
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_records(path: Path, records) -> None:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r.to_json(), sort_keys=True) + "\n")


def manifest(*, base_url: str, model: str, server_command: str | None, datasets: list, seeds: dict,
             extra: dict | None = None) -> dict:
    return {
        "harness": {"version": __version__, **git_commit()},
        "server": {"base_url": base_url, "command": server_command, "version": server_version(base_url)},
        "model": model,
        "datasets": list({d.digest: {"name": d.name, "params": d.params, "sha256": d.digest,
                                     "requests": len(d.items)} for d in datasets}.values()),
        "seeds": seeds,
        "host": host_info(),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(),
        **(extra or {}),
    }
