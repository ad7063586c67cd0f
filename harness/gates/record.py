"""`qwen36 baseline record`: measure a profile's workload N times and write it as a baseline file."""
from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
import sys
from pathlib import Path

from harness.bench.run import PRESETS, BenchConfig, on_this_machine, run_bench
from harness.errors import HarnessError
from harness.gates.baseline import (BASELINES_DIR, Baseline, baseline_path, load_policy, save_baseline,
                                    tolerances_for, with_floor)
from harness.gates.gate import load_run
from harness.gates.identity import identity_from_manifest

# The candidate repeats a gate against a committed baseline runs (CI's cpu-tiny check, the live gate's
# --gate-repeats default): recorded tolerances are sized for it.
GATE_REPEATS = 3
# Repeats measured first and left out of a baseline (and before a candidate's measured repeats): on the tiny
# server, official-like's prefix-cache hit rate reaches its steady value only on the third pass over its
# conversations (0.9265 on the second, 0.944 from the third: vLLM's `align` mode caches the recurrent state
# only at step ends), and TTFT with it.
WARM_REPEATS = 2


def baseline_from_runs(profile: str, run_dirs: list[Path], preset: str, how: str,
                       hardware: str | None = None, skip_first: int = 0, tolerance_floor: float | None = None,
                       candidate_repeats: int | None = None) -> Baseline:
    """A measured baseline from run directories (their repeats pooled per point; identities must agree),
    leaving out the first `skip_first` repeats of each point in each run. Tolerances are sized for gates of
    `candidate_repeats` candidate repeats (default: as many as the baseline has)."""
    if tolerance_floor is not None and not 0 < tolerance_floor < 1:
        raise HarnessError(f"--tolerance-floor {tolerance_floor}: a fraction between 0 and 1 (0.08 for 8%)")
    runs = [load_run(d) for d in run_dirs]
    run = runs[0]
    for other in runs[1:]:
        if identity_from_manifest(other.manifest) != identity_from_manifest(run.manifest):
            raise HarnessError(f"{other.path} and {run.path} measured different setups: record them separately")
    policy = load_policy()
    gated: dict[str, list[dict]] = {}
    for r in runs:
        for name, reps in r.points.items():
            gated.setdefault(name, []).extend({m: rep.get(m) for m in policy} for rep in reps[skip_first:])
    if not any(gated.values()):
        raise HarnessError(f"{', '.join(map(str, run_dirs))}: no completed repeat, nothing to record")
    tolerances, noise, notes = tolerances_for(gated, policy, floor=tolerance_floor,
                                              candidate_repeats=candidate_repeats)
    identity = identity_from_manifest(run.manifest)
    identity["hardware"] = hardware or _describe_host(run.manifest.get("host") or {})
    identity["workload"] = {"preset": preset}
    harness = run.manifest.get("harness") or {}
    recorded = {
        "source": "measured",
        "how": how,
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": harness.get("commit"),
        "dirty": harness.get("dirty"),
        "runs": [str(d) for d in run_dirs],
        "server_version": (run.manifest.get("server") or {}).get("version"),
    }
    if candidate_repeats:
        recorded["tolerances_sized_for"] = f"{candidate_repeats} candidate repeats"
    return Baseline(profile, identity, recorded, with_floor(policy, tolerance_floor), gated, noise,
                    point_tolerances=tolerances, notes=notes, tolerance_floor=tolerance_floor,
                    machine_speed=recorded_speed(runs))


def recorded_speed(runs: list) -> dict | None:
    """The machine's kind and speed while the runs were measured (the median of theirs), if every run measured the
    same probe on the same kind of machine; else None (a server on another machine: nothing to rescale by)."""
    speeds = [r.manifest.get("machine_speed") for r in runs]
    if not speeds or any(not s for s in speeds) or len({(s["probe"], s.get("machine")) for s in speeds}) != 1:
        return None
    return {"probe": speeds[0]["probe"], "unit": speeds[0].get("unit", "steps/s"),
            "rate": round(statistics.median(s["rate"] for s in speeds), 2), "machine": speeds[0].get("machine"),
            **({"busy": True} if any(s.get("busy") for s in speeds) else {})}


# The identity fields a client that knows the server only by its URL cannot see: a by-URL run's manifest
# leaves them empty, so a by-URL recording holds them unknown (None: not compared).
UNSEEN_BY_URL = ("model_files_sha256", "server_args")


def for_url_clients(baseline: Baseline) -> Baseline:
    """The baseline as a by-URL recording of the same runs would hold it, for live gates by URL."""
    identity = {**baseline.identity, **{k: None for k in UNSEEN_BY_URL}}
    recorded = {**baseline.recorded,
                "unseen_by_url": f"{', '.join(UNSEEN_BY_URL)}: not compared, the candidates know the server by URL"}
    return dataclasses.replace(baseline, identity=identity, recorded=recorded)


def _describe_host(host: dict) -> str:
    return f"{host.get('machine', '?')}, {host.get('cpus', '?')} CPUs, {host.get('platform', '?')}"


def record_baseline(profile: str, repeats: int, preset: str = "gate", base_url: str | None = None,
                    update: bool = False, out_root: Path | None = None, root: Path = BASELINES_DIR,
                    hardware: str | None = None, tolerance_floor: float | None = None,
                    warmups: int = WARM_REPEATS, tokenizer: Path | None = None,
                    api_key: str | None = None) -> tuple[Baseline, str]:
    """`tokenizer` (tokenizer.json or its model directory) sizes official-like's prompts for a server given by
    URL, as the embedded server's own model files do; without it they are sized at about 4 characters a
    token, a different dataset (and hash) from a run that knew the tokenizer."""
    if repeats < 2:
        raise HarnessError(f"--repeats {repeats}: a baseline needs at least 2 repeats to know its noise (5 advised)")
    if preset not in PRESETS:
        raise HarnessError(f"--preset {preset!r}: choose one of {', '.join(PRESETS)}")
    if tolerance_floor is not None and not 0 < tolerance_floor < 1:  # before the bench, as below
        raise HarnessError(f"--tolerance-floor {tolerance_floor}: a fraction between 0 and 1 (0.08 for 8%)")
    if warmups < 0:
        raise HarnessError(f"--warmups {warmups}: give 0 or more warm-up repeats ({WARM_REPEATS} for a fresh server)")
    path = baseline_path(profile, root)
    if path.exists() and not update:  # checked before the bench, not after minutes of measuring
        raise HarnessError(f"{path} exists; pass --update to replace it (the diff is printed)")
    # `warmups` extra repeats first, measured and kept in the run directory but not in the baseline.
    cfg = BenchConfig(workloads=PRESETS[preset], base_url=base_url, repeats=repeats + warmups,
                      label=f"baseline-{profile}", tokenizer=tokenizer, api_key=api_key,
                      machine_speed=base_url is None or on_this_machine(base_url),
                      **({"out_root": out_root} if out_root else {}))
    run_dir = run_bench(cfg)
    how = f"qwen36 baseline record --profile {profile} --repeats {repeats} --preset {preset}" + (
        f" --base-url {base_url}" if base_url else "") + (
        f" --tolerance-floor {tolerance_floor}" if tolerance_floor is not None else "") + (
        f" --warmups {warmups}" if warmups != WARM_REPEATS else "") + (
        f" --tokenizer {tokenizer}" if tokenizer else "")
    baseline = baseline_from_runs(profile, [run_dir], preset, how, hardware, skip_first=warmups,
                                  tolerance_floor=tolerance_floor, candidate_repeats=GATE_REPEATS)
    if warmups:
        baseline.recorded["note"] = (f"the first {warmups} repeats of each point warmed the server and are not in "
                                     "the baseline")
    diff = save_baseline(baseline, root, update=update)
    print(f"baseline {profile!r} written to {path} from {run_dir}", file=sys.stderr)
    return baseline, diff
