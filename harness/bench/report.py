"""Human views of a run: the metrics table (terminal and report.md) with the distance to the platform's
targets, and a PNG of the TTFT and per-request output TPS distributions. The table's metrics, their order,
units and directions come from the metric declarations (harness/bench/metrics.py)."""
from __future__ import annotations

from pathlib import Path

from harness.bench.metrics import REGISTRY, RunSummary, Scoring, shown_in, target_distance

TABLE_METRICS = shown_in("table")
_ARROW = {"higher": "↑", "lower": "↓", "info": ""}


def fmt(name: str, v) -> str:
    if v is None:
        return "n/a"
    unit = REGISTRY[name].unit if name in REGISTRY else ""
    if unit == "ratio":
        return f"{v:.1%}"
    if unit == "count":
        return str(int(v))
    if unit == "s":
        return f"{v * 1000:.1f} ms" if abs(v) < 1 else f"{v:.2f} s"
    return f"{v:.2f}"


def metrics_table(points: list[tuple[str, RunSummary]], scoring: Scoring) -> str:
    """Markdown table: one row per metric, one column per point, the platform target beside."""
    header = "| metric | " + " | ".join(name for name, _ in points) + " | platform target |"
    lines = [header, "|" + "---|" * (len(points) + 2)]
    for m in TABLE_METRICS:
        meta = REGISTRY[m]
        t = scoring.targets.get(m)
        target = f"{t.op} {fmt(m, t.value)}" if t else ""
        cells = []
        for _, s in points:
            v = s.metrics.get(m)
            mark = ""
            if t and v is not None:
                mark = " ✓" if t.met(v) else " ✗"
            cells.append(fmt(m, v) + mark)
        lines.append(f"| {m} {_ARROW[meta.direction]} ({meta.unit}) | " + " | ".join(cells) + f" | {target} |")
    return "\n".join(lines)


def target_table(summary: RunSummary, scoring: Scoring) -> str:
    lines = ["| metric | value | target | met | distance (+ margin / − shortfall) |", "|---|---|---|---|---|"]
    for row in target_distance(summary, scoring):
        m = row["metric"]
        met = {True: "yes", False: "no", None: "n/a"}[row["met"]]
        dist = "n/a" if row["distance"] is None else fmt(m, row["distance"])
        lines.append(f"| {m} | {fmt(m, row['value'])} | {row['op']} {fmt(m, row['target'])} | {met} | {dist} |")
    return "\n".join(lines)


def write_report(path: Path, *, title: str, manifest: dict, points: list[tuple[str, RunSummary]],
                 scoring: Scoring, end_reason: str, server_view: dict | None, hardware: dict | None,
                 notes: list[str]) -> None:
    md = [f"# {title}", ""]
    srv = manifest["server"]
    md += [f"- server: `{srv['base_url']}` (vLLM {srv.get('version') or 'version unknown'})",
           f"- model: `{manifest['model']}`",
           f"- harness {manifest['harness']['version']} at commit {manifest['harness']['commit']}"
           + (" (dirty tree)" if manifest["harness"]["dirty"] else ""),
           f"- run ended: **{end_reason}**", ""]
    md += ["## Metrics", "", "Arrows give each metric's better direction; ✓/✗ compare with the platform target.",
           "", metrics_table(points, scoring), ""]
    md += ["## Distance to the platform targets", ""]
    for name, s in points:
        md += [f"### {name}", "", target_table(s, scoring), ""]
        failures = {k: v for k, v in s.failures.items() if v}
        if failures:
            md += [f"Failures by class: {failures}", ""]
        for n in s.notes:
            md += [f"> {n}", ""]
    md += ["## Server-side view (Prometheus /metrics deltas over the measured phases)", ""]
    if server_view:
        md += ["| point | prefix-cache queries | hits | server hit rate | usage hit rate | preemptions | mean queue time |",
               "|---|---|---|---|---|---|---|"]
        for name, v in server_view.items():
            d = v["deltas"]
            md.append(f"| {name} | {d.get('prefix_cache_queries', 0):.0f} | {d.get('prefix_cache_hits', 0):.0f} | "
                      f"{fmt('cache_hit_rate', d.get('server_prefix_cache_hit_rate'))} | "
                      f"{fmt('cache_hit_rate', v.get('usage_hit_rate'))} | {d.get('preemptions', 0):.0f} | "
                      f"{fmt('ttft_p50', d.get('mean_queue_time_s'))} |")
            if v.get("disagreement"):
                md.append(f"\n> ⚠ {name}: {v['disagreement']}\n")
    else:
        md.append("The server has no Prometheus /metrics endpoint (or it could not be read).")
    md += ["", "## Hardware view", ""]
    if hardware:
        md += ["| device | samples | util mean / max (%) | memory mean / max (MiB) | power mean / max (W) |",
               "|---|---|---|---|---|"]
        def mm(stat: dict | None) -> str:
            return "n/a" if not stat else f"{stat['mean']:.0f} / {stat['max']:.0f}"

        for dev, s in hardware.items():
            md.append(f"| {dev} | {s['samples']} | {mm(s['util_pct'])} | {mm(s['mem_used_mib'])} | {mm(s['power_w'])} |")
    else:
        md.append("No accelerator sampler (nvidia-smi / ixsmi) on this host: nothing sampled.")
    if notes:
        md += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    md += ["", "Files: `manifest.json`, `requests.jsonl` (raw timestamps), `summary.json`, `plot.png`"
           + (", `hardware.jsonl`" if hardware else "") + "."]
    Path(path).write_text("\n".join(md) + "\n")


def write_plot(path: Path, per_point: list[tuple[str, list]]) -> None:
    """TTFT and per-request output TPS distributions (empirical CDFs), one line per point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, records in per_point:
        ok = [r for r in records if r.ok and not r.tags.get("warmup")]
        for ax, values in ((ax1, [r.ttft_s for r in ok]), (ax2, [r.output_tps for r in ok if r.output_tps])):
            xs = sorted(values)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
    ax1.set(title="TTFT", xlabel="seconds", ylabel="fraction of requests ≤ x")
    ax2.set(title="Per-request output TPS", xlabel="tokens / s (log)", ylabel="fraction of requests ≤ x")
    if ax2.lines:
        ax2.set_xscale("log")  # held-back streams give very large values beside real decode speeds
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no successful request", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
