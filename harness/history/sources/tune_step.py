"""`qwen36 tune step` (harness/tune/step/report.py): step.json, the whole decode step of one rank per batch size.

Per batch B: the eager step's median (`gpu.decode_step.b<B>.eager_us`, its p25..p75), the graph replay's where it
was captured (`...graph_replay_us`), and the kernels one eager step launches (`...kernels`, an exact count). The
command reports; the step's gate is the table's `decode_step` point, which `qwen36 tune` records and `--check`
judges (tune_table, tune_check): these figures are drawn, not gated.
"""
from __future__ import annotations

from harness.history.machines import device_machine
from harness.history.record import Figure, Record
from harness.history.sources.common import Given, NoFigures, build_record, metric, run_date
from harness.history.sources.gpu_names import gpu_detail

__all__ = ["FILES", "WRITER", "KIND", "claims", "from_payload"]

FILES = ("step.json",)
WRITER = "`qwen36 tune step` (harness/tune/step/report.py)"
KIND = "tune-step"


def claims(raw) -> bool:
    """A step.json by its fields: the rank's model config and the step's timings per batch (files before the graph
    column lack `graph_method`)."""
    return (isinstance(raw, dict) and isinstance(raw.get("rows"), list) and "rank_config" in raw
            and all(isinstance(r, dict) and "batch" in r for r in raw["rows"]))


def _timing(name: str, t: dict | None, what: str) -> Figure | None:
    if not t or t.get("median_us") is None:
        return None
    return Figure(name, float(t["median_us"]), "us", "lower", t.get("p25_us"), t.get("p75_us"),
                  f"IQR of {t.get('samples')} {what}", None, False)


def from_payload(raw: dict, given: Given, source: str) -> list[Record]:
    figures, skipped = [], []
    for row in raw.get("rows", []):
        b = row.get("batch")
        if row.get("status") != "ok":
            skipped.append(f"B={b}: {row.get('status')} ({row.get('detail')})")
            continue
        eager = _timing(metric("gpu", "decode_step", f"b{b}", "eager_us"), row.get("step"), "steps")
        graph = row.get("graph") or {}
        replay = _timing(metric("gpu", "decode_step", f"b{b}", "graph_replay_us"), graph.get("replay"),
                         "replays") if graph.get("status") == "ok" else None
        kernels = row.get("kernels") or {}
        count = None if kernels.get("kernels") is None else Figure(
            metric("gpu", "decode_step", f"b{b}", "kernels"), float(kernels["kernels"]), "kernels", "lower",
            spread="kernel events of one eager step (torch.profiler)", gated=False)
        figures += [f for f in (eager, replay, count) if f is not None]
        if graph and graph.get("status") != "ok":
            skipped.append(f"B={b} graph: {graph.get('status')}")
    if not figures:
        raise NoFigures(f"{source}: no batch size measured ({'; '.join(skipped) or 'no rows'})")
    date, notes = run_date(raw.get("date"), given, source)
    commit, how = given.commit_and_how(None, "not recorded: step.json names no commit")
    notes += [f"dims {raw.get('dims')}, dtype {raw.get('dtype')}, TP {raw.get('tp')}, prefill {raw.get('prefill')}, "
              f"router {raw.get('router')}, norm {raw.get('norm')}, dispatch {raw.get('dispatch')}",
              *(f"not measured: {s}" for s in skipped)]
    machine = device_machine(raw.get("device"), gpu_detail(None, raw.get("torch")))  # step.json names no GPU UUID
    return [build_record(kind=KIND, date=date, commit=commit, commit_source=how, machine=given.machine_or(machine),
                         command=raw.get("command", ""), source=source, figures=figures, notes=notes)]
