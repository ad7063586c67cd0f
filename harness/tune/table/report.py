"""The tuner's outputs for people: a console table per block, and the same as JSON and Markdown files."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..measure.point import Measurement
from .block_rows import is_layer_row
from .targets import Verdict

__all__ = ["Section", "format_rows", "layer_breakdown", "write_report", "verdict_sections", "cost_section"]

TITLES = {
    "moe_experts": "Routed experts (T tokens)",
    "moe_block": "Whole MoE block: router + routed experts + shared expert, composed with each expert path, and each fused block path (T tokens)",
    "moe_block_graphed": "Whole MoE block replayed from a per-bucket CUDA graph (model.moe.GraphedMoEBlock), each block path it captures: eager is the cost to an eager caller (copy in, replay, copy out); not a dispatch choice (T tokens)",
    "moe_router": "Router alone: top-k and softmax of the router logits, after the router GEMM (T tokens)",
    "gdn_prefill": "Gated delta rule, prefill (B=1, T tokens)",
    "gdn_decode": "Gated delta rule, one decode step (T=1, B sequences)",
    "gdn_conv": "GDN causal conv1d + SiLU of the staged layer (B=1, T tokens)",
    "gdn_gated_norm": "GDN gated RMSNorm of the staged layer (rows: B*T tokens)",
    "gdn_layer_prefill": "GDN layer by stage, prefill (B=1, T tokens)",
    "gdn_layer_decode": "GDN layer by stage (`layer`: the staged layer whole), and each fused decode-layer path, decode (T=1, B sequences)",
    "attention_layer_decode": "Full-attention layer, one token per sequence over a static KV cache (T=1, B sequences; context: the keys already cached)",
    "add_rms_norm": "Residual add + zero-centred RMSNorm between blocks (rows: B*T tokens)",
    "triton_decode_configs": "triton_decode: every candidate block config (T tokens)",
    "triton_grouped_configs": "triton_grouped: every candidate block config (T tokens)",
}
HEADER = ("point", "path", "status", "eager us (IQR/med)", "graph us (IQR/med)", "gpu us", "host us", "err", "bound",
          "floor us (hbm/compute)", "eager/floor", "graph/floor")


def _us(t) -> str:
    return "-" if t is None else f"{t.median_us:,.1f} ({t.spread:.0%})"


def _num(x, fmt) -> str:
    return "-" if x is None else format(x, fmt)


def _cells(r: Measurement) -> tuple[str, ...]:
    d = r.as_dict()
    floor = "-" if r.floor is None or r.floor.us is None else (
        f"{r.floor.us:,.1f} ({_num(r.floor.hbm_us, ',.1f')}/{_num(r.floor.compute_us, ',.1f')})")
    graph = _us(r.graph) if r.graph else (r.graph_note or "-")
    status = r.status if not r.detail else f"{r.status}: {r.detail}"
    return (str(r.key), r.path, status, _us(r.eager), graph, _num(r.gpu.median_us if r.gpu else None, ",.1f"),
            _num(r.host_us, ",.1f"), _num(r.err_eager, ".2e"),
            _num(r.bound if r.bound != float("inf") else None, ".0e"), floor,
            _num(d["eager_x_floor"], ".1f"), _num(d["graph_x_floor"], ".1f"))


def _blocks(rows: list[Measurement]) -> list[str]:
    seen = []
    for r in rows:
        if r.block not in seen:
            seen.append(r.block)
    return seen


def format_rows(rows: list[Measurement], block: str) -> str:
    table = [HEADER] + [_cells(r) for r in rows if r.block == block]
    widths = [min(60, max(len(row[i]) for row in table)) for i in range(len(HEADER))]
    lines = [TITLES.get(block, block)]
    for row in table:
        lines.append("  ".join(c[:60].ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _markdown_rows(rows: list[Measurement], block: str) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        if r.block == block:
            lines.append("| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |")
    return "\n".join(lines)


def layer_breakdown(rows: list[Measurement]) -> list[str]:
    """Per layer point: each stage's share of the layer (graph time where captured, else eager), the largest."""
    out = []
    for block in ("gdn_layer_prefill", "gdn_layer_decode"):
        for key in sorted({r.key for r in rows if r.block == block}):
            stages = {r.path: r for r in rows if r.block == block and r.key == key and r.status == "ok"
                      and (r.path == "layer" or not is_layer_row(block, r.path))}  # fused layers: no stages
            layer = stages.pop("layer", None)
            if not stages:
                continue
            mode = "graph" if all(r.graph for r in stages.values()) else "eager"
            times = {n: (r.graph if mode == "graph" else r.eager).median_us for n, r in stages.items()}
            top = max(times, key=times.get)
            total = sum(times.values())
            layer_us = None if layer is None else (layer.graph or layer.eager).median_us
            shares = ", ".join(f"{n} {t:,.1f}" for n, t in times.items())
            label = "prefill T=" if block == "gdn_layer_prefill" else "decode B="
            extra = next(iter(stages.values())).extra
            out.append(f"{label}{key}: stages ({mode} us) {shares}; sum {total:,.1f}"
                       f"{'' if layer_us is None else f', whole layer {layer_us:,.1f}'}; largest: {top} "
                       f"({times[top] / total:.0%}); rule path {extra.get('rule')}, conv {extra.get('conv')}, "
                       f"gated norm {extra.get('norm')}")
    return out


@dataclass(frozen=True)
class Section:
    """A result beyond the rows (the config sweep's): `data` under `key` in the JSON, `lines` under `title` in
    the Markdown, before the rows."""
    key: str
    title: str
    data: object
    lines: list[str]


def write_report(directory: Path, meta: dict, rows: list[Measurement], table: dict | None,
                 verdicts: list[Verdict], notes: list[str], sections: list[Section] = ()) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    payload = {**meta, "targets": [v.__dict__ | {"line": v.line()} for v in verdicts], "notes": notes,
               "layer_breakdown": layer_breakdown(rows), **{x.key: x.data for x in sections}, "table": table,
               "rows": [r.as_dict() for r in rows]}
    json_path = directory / "tune.json"
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    md = [f"# `qwen36 tune` on {meta['device']} ({meta['date']})", "",
          f"- command: `{meta['command']}`", f"- torch {meta['torch']}, triton {meta.get('triton')}, "
          f"dtype {meta['dtype']}, dims {meta['dims']['name']}",
          f"- ceilings: {meta['ceilings']}", f"- timing: {meta['timing']}", ""]
    if verdicts:
        md += ["## Targets", ""] + [f"- {v.line()}" for v in verdicts] + [""]
    if notes:
        md += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    for x in sections:
        md += [f"## {x.title}", "", *x.lines, ""]
    breakdown = layer_breakdown(rows)
    if breakdown:
        md += ["## GDN layer: which stage dominates", ""] + [f"- {b}" for b in breakdown] + [""]
    for block in _blocks(rows):
        md += [f"## {TITLES.get(block, block)}", "", _markdown_rows(rows, block), ""]
    md += cost_section(rows, meta.get("call_costs"))
    if table:
        md += ["## Dispatch table written", ""]
        for block, spec in table["blocks"].items():
            spans = "; ".join(f"{r['from']}..{r['to'] if r['to'] is not None else ''}: {r['path']}"
                              for r in spec["ranges"])
            md += [f"- {block} (by {spec['keyed_by']}): {spans}"]
        md.append("")
    md_path = directory / "tune.md"
    md_path.write_text("\n".join(md))
    return json_path, md_path


def verdict_sections(failures: list[str], notes: list[str], lines: list[str]) -> list[str]:
    """The Markdown a gate's report ends with (`--check`, `--ab`): its failures and notes where there are any,
    then every point's verdict."""
    md = []
    if failures:
        md += ["## Failures", "", *[f"- {f}" for f in failures], ""]
    if notes:
        md += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    return md + ["## Every point", "", *[f"- {line}" for line in lines], ""]


def _launches(counts: dict | None) -> str:
    if not counts:
        return "-"
    return " + ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "0"


def cost_section(rows: list[Measurement], costs: dict | None) -> list[str]:
    """Markdown: per point, what an eager caller pays, the GPU's own time, a replay as a caller times it, the
    host's microseconds per call (and in ATen ops measured in the same run), and the launches of one call and
    one replay; above it the ATen op's and the timer's own cost."""
    if not rows:
        return []
    aten = (costs or {}).get("aten_op_host_us")
    md = ["## GPU time and host time", ""]
    if costs:
        md += [f"- one ATen op ({costs['aten_op']}): host {costs['aten_op_host_us']:,.2f} us per call (back to back), "
               f"{costs['aten_op_eager_us']:,.2f} us timed as an eager call", f"- the timer's own cost (an empty call "
               f"timed as an eager call: flush, synchronise, start event, nothing, end event): "
               f"{costs['timer_us']:,.2f} us, in every eager figure", ""]
    md += ["| point | path | eager us (host + GPU) | GPU us (launch hidden) | graph us (replay, launch included) "
           "| host us per call | host in ATen ops | launches, one call | launches, one replay |",
           "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if r.status != "ok":
            continue
        ratio = f"{r.host_us / aten:.1f}" if aten and r.host_us is not None else "-"
        md.append(f"| {r.block} {r.key} | {r.path} | {_num(r.eager.median_us if r.eager else None, ',.1f')} "
                  f"| {_num(r.gpu.median_us if r.gpu else None, ',.1f')} "
                  f"| {_num(r.graph.median_us if r.graph else None, ',.1f')} | {_num(r.host_us, ',.1f')} | {ratio} "
                  f"| {_launches(r.launches)} | {_launches(r.graph_launches)} |")
    return md + [""]
