"""A recorded profile (fixtures/baselines/<profile>.yaml, harness/gates/baseline.py): what the live gate compares a
server with, measured by `qwen36 baseline record` (cpu-tiny, on the embedded server) or imported from a team's
records (bi-v100-tp4-245k).

Per point, the gated metrics of its repeats, named as `qwen36 bench` names them (`bench.<dataset>.c<N>.<metric>`):
a live gate's run against the same server continues the profile's line. The value is the gate's centre of the
repeats (geometric mean where the tolerance is relative, mean where absolute), the threshold the profile's
relative tolerance at the point. The machine: the speed probe's kind where the recording measured it; an
imported profile's hardware, as a server's (machines.server_machine, as the live gate's run names it).
"""
from __future__ import annotations

from harness.history.machines import machine_from_kind_text, server_machine
from harness.history.record import FULL_HASH, Figure, Record
from harness.history.sources.common import (
    Given, NoFigures, build_record, centre, metric, min_max, point_segments, relative, run_date,
)

__all__ = ["WRITER", "KIND", "claims", "from_payload"]

WRITER = "`qwen36 baseline record` (harness/gates/baseline.py, fixtures/baselines/<profile>.yaml)"
KIND = "baseline"


def claims(raw) -> bool:
    return isinstance(raw, dict) and "profile" in raw and isinstance(raw.get("points"), dict) and "recorded" in raw


def _tolerance(raw: dict, point: dict, name: str) -> dict:
    return (point.get("tolerances") or {}).get(name) or (raw.get("tolerances") or {}).get(name) or {}


def from_payload(raw: dict, given: Given, source: str) -> list[Record]:
    from harness.bench.metrics import REGISTRY, shown_in

    figures = []
    for point, data in raw["points"].items():
        repeats = (data or {}).get("repeats") or []
        for name in shown_in("gates"):
            values = [float(r[name]) for r in repeats if isinstance(r.get(name), (int, float))
                      and not isinstance(r.get(name), bool)]
            if not values:
                continue
            tol = _tolerance(raw, data, name)
            scale = tol.get("scale", "relative")
            low, high = min_max(values)
            spec = REGISTRY[name]
            spread = (f"min..max of {len(values)} repeats; value: their "
                      f"{'geometric ' if scale == 'relative' and all(v > 0 for v in values) else ''}mean"
                      if low is not None else "one run")
            figures.append(Figure(metric("bench", *point_segments(point), name), centre(values, scale), spec.unit,
                                  spec.direction, low, high, spread,
                                  relative(tol.get("value")) if scale == "relative" else None, True))
    if not figures:
        raise NoFigures(f"{source}: profile {raw.get('profile')!r} holds no gated value")
    recorded = raw.get("recorded") or {}
    identity = raw.get("identity") or {}
    probe = (raw.get("machine_speed") or {}).get("machine")
    if probe:
        machine = machine_from_kind_text(probe)
    elif recorded.get("source") == "imported":
        machine = server_machine("", identity.get("hardware") or raw.get("profile"))
    else:
        machine = machine_from_kind_text(str(identity.get("hardware", "")))
    found = str(recorded.get("commit") or "")
    if FULL_HASH.match(found) and recorded.get("source") != "imported":
        how = f"recorded.commit of {source}"
    else:
        how = (f"not known: recorded.commit {found or 'absent'} ({recorded.get('source')}) is no full hash of this "
               "repository")
        found = None
    commit, how = given.commit_and_how(found, how)
    date, notes = run_date(str(recorded.get("when") or "") or None, given, source)
    workload = identity.get("workload")  # {preset: ...}; early profiles described it in words
    notes += [f"profile {raw.get('profile')} ({recorded.get('source')}), workload "
              f"{workload.get('preset') if isinstance(workload, dict) else workload}",
              *(["recorded on a tree with uncommitted changes (recorded.dirty)"] if recorded.get("dirty") else []),
              *([str(recorded["note"])] if recorded.get("note") else [])]
    return [build_record(kind=KIND, date=date, commit=commit, commit_source=how, machine=given.machine_or(machine),
                         command=str(recorded.get("how") or "qwen36 baseline record"), source=source,
                         figures=figures, notes=notes)]
