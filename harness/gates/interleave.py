"""Measure servers of this machine in alternating short blocks, for paired A/B verdicts (harness.gates.paired).

A block is one repeat of one workload point (its own warm-up requests first) on one arm, with every other
server idle. An arm is a server, possibly with its test-only step slowdown set for its blocks
(patches/model_paths/step_slowdown.py), so one server can be two arms: the twin as itself (the A/A control) and slowed
(an injected regression). A round runs every point on every arm; even rounds take the arms in order, odd rounds
in reverse, so a drift that is linear over a round moves both sides of every pair alike and cancels in the mean
of the pair ratios. Short blocks cancel more of it: on the 2-core CI kind, a machine whose speed moves by tens of
percent within seconds, blocks of 3 s gave pairs half as spread as blocks of 7 s (docs/perf-gates.md).

Before each block the harness waits `quiet_s` after the last request of the previous one on another server: vLLM's
CPU engine core and worker busy-wait for a second after their last message (SpinCondition's busy_loop_s), and a
block that starts inside that spin shares its core with the other server.

The result is a directory with one ordinary run directory per arm (manifest.json, summary.json with one repeat
per round, requests.jsonl, report.md; `qwen36 compare` reads them) and `rounds.json`: the arms, and each block
in the order it ran. Records are appended as each block ends, and the summaries are written whatever happens
(Ctrl-C, a server that dies), so what was measured is kept.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from harness.bench.artifacts import new_run_dir, write_json
from harness.bench.client import ClientConfig
from harness.bench.metrics import Scoring
from harness.bench.run import BenchConfig, Workload, _token_counter, build_points, write_outputs
from harness.bench.runner import Point, PointResult, run_points
from harness.serving.placement import client_on
from harness.serving.shared_server import ServerInfo

# vLLM CPU's busy-wait after its last message lasts 1 s (shm_broadcast.SpinCondition); 1.2 s clears it.
QUIET_S = 1.2


@dataclass(frozen=True)
class Arm:
    """One side of the comparisons: `label` names it (a directory of the result); `slowdown(point)` is the step
    slowdown its server runs that point's blocks with ("" none), for a server whose slowdown can be set."""
    label: str
    server: ServerInfo
    slowdown: Callable[[str], str] | None = None


@dataclass
class InterleavedRun:
    """What an interleaved measurement left: the directory, and how it ended."""
    path: Path
    rounds: int  # complete rounds (every point on every arm)
    end_reason: str  # "completed", "interrupted", or why it stopped early
    labels: list[str] = field(default_factory=list)

    def arm(self, label: str) -> Path:
        return self.path / label


def interleave(arms: list[Arm], workloads: tuple[Workload, ...], rounds: int, out_root: Path, label: str,
               tokenizer: Path | None = None, quiet_s: float = QUIET_S, show_progress: bool = False,
               exclude_stalled: bool = True) -> InterleavedRun:
    """Run `rounds` rounds of blocks of every point of `workloads` on every arm; `tokenizer` sizes official-like's
    prompts (default: the first arm's model directory)."""
    if rounds < 2:
        raise ValueError(f"rounds={rounds}: a paired verdict needs at least 2 pairs (the spread of their ratios)")
    labels = [a.label for a in arms]
    if len(arms) < 2 or len(set(labels)) != len(labels):
        raise ValueError(f"arms {labels}: give two or more, each with its own label")
    root = new_run_dir(out_root, label)
    cfgs = {a.label: _config(a, workloads, root, tokenizer) for a in arms}
    points = build_points(cfgs[arms[0].label], _token_counter(cfgs[arms[0].label], _model_dir(arms[0])))
    scoring = Scoring.load()
    results = {a.label: [PointResult(Point(p.name, p.dataset, p.concurrency, rounds)) for p in points] for a in arms}
    for a in arms:
        (root / a.label).mkdir()
    blocks: list[dict] = []
    end_reason, done = "completed", 0
    bar = tqdm(total=rounds * len(points) * len(arms), desc=f"{label}: interleaved blocks", file=sys.stderr,
               unit="block", disable=not show_progress)
    last_end, last_server = 0.0, None
    try:
        with client_on(arms[0].server.client_cpus):
            for i in range(rounds):
                for k, point in enumerate(points):
                    for arm in (arms if i % 2 == 0 else arms[::-1]):
                        slowdown = _set_slowdown(arm, point.name)
                        if arm.server.base_url != last_server:  # its own spin is no other server's
                            time.sleep(max(0.0, last_end + quiet_s - time.monotonic()))
                        block = Point(point.name, point.dataset, point.concurrency, 1)
                        began = time.time()
                        (res,), reason = run_points(_client(arm), [block], scoring, show_progress=False,
                                                    exclude_stalled=exclude_stalled)
                        last_end, last_server = time.monotonic(), arm.server.base_url
                        _keep_block(results[arm.label][k], res, i, root / arm.label)
                        blocks.append({"round": i, "point": point.name, "arm": arm.label, "slowdown": slowdown,
                                       "started": began, "seconds": round(time.time() - began, 3),
                                       "successes": res.summaries[0].get("successes") if res.summaries else 0})
                        bar.update(1)
                        if reason == "interrupted":
                            end_reason = "interrupted"
                            raise KeyboardInterrupt
                        if not res.summaries or not res.summaries[0].get("successes"):
                            end_reason = f"arm {arm.label} answered no request in round {i} ({point.name})"
                            raise _Stop
                done = i + 1
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        bar.close()
        for arm in arms:
            if arm.slowdown is not None:
                _set_slowdown(arm, None)
            _write_arm(root / arm.label, cfgs[arm.label], arm.server, results[arm.label], end_reason, scoring)
        write_json(root / "rounds.json", {"arms": {a.label: a.server.base_url for a in arms}, "rounds": done,
                                          "end_reason": end_reason, "quiet_s": quiet_s,
                                          "points": [p.name for p in points], "blocks": blocks})
    return InterleavedRun(root, done, end_reason, labels)


class _Stop(Exception):
    """An arm answered nothing: more rounds would only measure a dead server."""


def _set_slowdown(arm: Arm, point: str | None) -> str | None:
    """Set the arm's server's step slowdown for `point`'s block (None: back to none); returns what was set."""
    if arm.slowdown is None:
        return None
    from harness.gates.servers import set_step_slowdown

    text = arm.slowdown(point) if point is not None else ""
    set_step_slowdown(arm.server, text)
    return text


def _model_dir(arm: Arm) -> Path | None:
    return Path(arm.server.model_dir) if arm.server.model_dir else None


def _config(arm: Arm, workloads, root: Path, tokenizer: Path | None) -> BenchConfig:
    return BenchConfig(workloads=workloads, base_url=arm.server.base_url, model=arm.server.model,
                       api_key=arm.server.api_key, tokenizer=tokenizer, out_root=root, label=arm.label,
                       show_progress=False, server_command=arm.server.command, model_dir=_model_dir(arm),
                       client_cpus=arm.server.client_cpus)


def _client(arm: Arm) -> ClientConfig:
    return ClientConfig(arm.server.base_url, arm.server.model, arm.server.api_key, timeout_s=600.0,
                        stall_timeout_s=120.0)


def _keep_block(into: PointResult, block: PointResult, round_: int, directory: Path) -> None:
    """Add a block's records and its summary (as repeat `round_`) to the arm's point; append its records to the
    arm's requests.jsonl at once, so a run cut short keeps them."""
    for rec in block.records:
        rec.tags["round"] = round_
    into.records += block.records
    into.summaries += [s.for_repeat(round_, s.interrupted) for s in block.summaries]
    with open(directory / "requests.jsonl", "a") as f:
        for rec in block.records:
            f.write(json.dumps(rec.to_json(), sort_keys=True) + "\n")


def _write_arm(directory: Path, cfg: BenchConfig, server: ServerInfo, results: list[PointResult],
               end_reason: str, scoring: Scoring) -> None:
    measured = [r for r in results if r.summaries]
    write_outputs(directory, cfg, server.base_url, server.model, None, cfg.model_dir, measured, end_reason, {},
                  scoring, None, quiet=True)
