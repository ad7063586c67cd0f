"""Run the perf gate's workload against a server and return the run directory."""
from __future__ import annotations

from pathlib import Path

from harness.bench import PRESETS, BenchConfig, run_bench
from harness.shared_server import ServerInfo


def measure(server: ServerInfo, out_root: Path, label: str, repeats: int = 1, base_url: str | None = None,
            preset: str = "gate", datasets: tuple[str, ...] | None = None) -> Path:
    """`base_url` overrides the server's URL (a proxy in front of it); the manifest still describes the
    server itself, so the run stays comparable. `datasets` keeps only those workloads of the preset: the gate
    then compares just their points."""
    workloads = tuple(w for w in PRESETS[preset] if datasets is None or w.dataset in datasets)
    if not workloads:
        raise ValueError(f"preset {preset!r} has no workload of {datasets}")
    cfg = BenchConfig(
        workloads=workloads, base_url=base_url or server.base_url, model=server.model, repeats=repeats,
        out_root=out_root, label=label, show_progress=False, server_command=server.command,
        model_dir=Path(server.model_dir) if server.model_dir else None, client_cpus=server.client_cpus,
    )
    return run_bench(cfg)
