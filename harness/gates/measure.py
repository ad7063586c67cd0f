"""Measure a gate's workload against a server this machine runs, and warm that server once.

A gate's candidate is measured after warm-up repeats that bring the prefix cache to the steady state the
baseline was recorded in (harness.gates.record.WARM_REPEATS). Warming is state, not measurement: what it leaves
is the server's prefix cache, which nothing evicts before the measurement (a server's KV cache holds 40 times
the gate workload). So `make test` warms the perf gates' servers during its parallel run, as soon as they are
up (harness.suite_session), and the timing run only measures. Each warm-up done is recorded in a marker beside
the server's log; a test asking for the same warm-up then finds it done, and warms the server itself when it
runs without that owner (plain `pytest -m timing`).
"""
from __future__ import annotations

import fcntl
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.bench.run import PRESETS, BenchConfig, run_bench
from harness.gates.record import WARM_REPEATS
from harness.serving.shared_server import ServerInfo


def measure(server: ServerInfo, out_root: Path, label: str, repeats: int = 1, preset: str = "gate",
            datasets: tuple[str, ...] | None = None, machine_speed: bool = True) -> Path:
    """Run the preset's workloads (only `datasets`, if given: a gate then compares just their points) and return
    the run directory; the manifest describes the server (its command and model files) and this machine's speed
    that day (harness.machine.speed), so runs compare."""
    workloads = tuple(w for w in PRESETS[preset] if datasets is None or w.dataset in datasets)
    if not workloads:
        raise ValueError(f"preset {preset!r} has no workload of {datasets}")
    cfg = BenchConfig(
        workloads=workloads, base_url=server.base_url, model=server.model, repeats=repeats,
        out_root=out_root, label=label, show_progress=False, server_command=server.command,
        model_dir=Path(server.model_dir) if server.model_dir else None, client_cpus=server.client_cpus,
        machine_speed=machine_speed,
    )
    return run_bench(cfg)


@dataclass(frozen=True)
class Warmup:
    """`repeats` runs of the preset's workloads (only `datasets`, if given) before a candidate is measured."""
    repeats: int
    datasets: tuple[str, ...] | None = None
    preset: str = "gate"

    @property
    def name(self) -> str:
        return f"{self.preset}-{'+'.join(self.datasets) if self.datasets else 'all'}-x{self.repeats}"


# The `paired` preset's official-like twice brings a prefix cache to its steady state for the prompts it measures
# (the hybrid model's cache settles on the second pass); every arm of a paired gate gets it, so they compare in the
# same state (decode-micro has no cache state: its prompts are shorter than a KV block).
STEADY_PREFIX_CACHE = Warmup(WARM_REPEATS, ("official-like",), "paired")


def _marker(server: ServerInfo, warmup: Warmup) -> Path:
    return Path(server.log_path).with_name(f"{Path(server.log_path).stem}.warm-{warmup.name}.json")


def warm(server: ServerInfo, warmup: Warmup, out_root: Path) -> bool:
    """Run `warmup` against `server` unless it has had it; True when it ran now. Two processes asking at once
    take turns (a lock beside the server's log), so the second finds it done. A server without a log (known
    by URL only) is warmed every time: nothing here can know its state."""
    def run() -> Path:
        return measure(server, out_root, f"warmup-{warmup.name}", repeats=warmup.repeats, preset=warmup.preset,
                       datasets=warmup.datasets, machine_speed=False)  # state, not a measurement

    if warmup.repeats < 1:
        return False
    if not server.log_path:
        run()
        return True
    marker = _marker(server, warmup)
    with open(marker.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if marker.exists():
                return False
            marker.write_text(json.dumps({**asdict(warmup), "run": str(run())}))
            return True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
