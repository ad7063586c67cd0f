"""The hardware view: sample accelerator utilisation, memory and power once a second during a run.

`nvidia-smi` and Iluvatar's `ixsmi` accept the same `--query-gpu` style; with neither on PATH the sampler
does nothing and the report says so.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

QUERY = "index,utilization.gpu,memory.used,memory.total,power.draw,power.limit"
FIELDS = ("index", "util_pct", "mem_used_mib", "mem_total_mib", "power_w", "power_limit_w")


def find_sampler() -> str | None:
    for tool in ("nvidia-smi", "ixsmi"):
        if shutil.which(tool):
            return tool
    return None


def parse_csv(text: str) -> list[dict]:
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        row = {}
        for name, value in zip(FIELDS, parts):
            try:
                row[name] = float(value)
            except ValueError:
                row[name] = None  # "[N/A]" on devices without that sensor
        rows.append(row)
    return rows


class HardwareSampler:
    """Context manager: a thread that appends one JSON line per device per second to `path`."""

    def __init__(self, path: Path, tool: str | None = None, period_s: float = 1.0):
        self.path = Path(path)
        self.tool = tool or find_sampler()
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "HardwareSampler":
        if self.tool:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        with open(self.path, "a") as out:
            while not self._stop.is_set():
                t = time.time()
                try:
                    text = subprocess.run([self.tool, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                                          capture_output=True, text=True, timeout=10).stdout
                except (OSError, subprocess.TimeoutExpired):
                    text = ""
                for row in parse_csv(text):
                    out.write(json.dumps({"t": t, **row}) + "\n")
                out.flush()
                self._stop.wait(self.period_s)


def summarize_samples(path: Path) -> dict[str, dict] | None:
    """Per device: mean and max of utilisation, memory and power; None when nothing was sampled."""
    if not Path(path).exists():
        return None
    by_dev: dict[str, list[dict]] = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        by_dev.setdefault(str(int(row["index"])), []).append(row)
    out = {}
    for dev, rows in sorted(by_dev.items()):
        stats = {"samples": len(rows)}
        for f in ("util_pct", "mem_used_mib", "power_w"):
            vals = [r[f] for r in rows if r.get(f) is not None]
            stats[f] = {"mean": sum(vals) / len(vals), "max": max(vals)} if vals else None
        out[dev] = stats
    return out or None
