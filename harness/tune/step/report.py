"""`qwen36 tune step`'s outputs: a short console table, and step.json + step.md in the tune report directory."""
from __future__ import annotations

import json
from pathlib import Path

from .graph import CHECK_STEPS

__all__ = ["format_step_table", "write_step_report", "graph_notes", "ops_notes", "GRAPH_FINDINGS", "GRAPH_METHOD",
           "KIND_ORDER"]

KIND_ORDER = ("moe", "mlp", "gdn", "attention", "norm", "lm_head", "embed", "other")

# What blocks capturing the decode step, checked by reading model/qwen36, model/gdn, model/attention/layer.py and
# model/moe; the report prints it under the graph column.
GRAPH_FINDINGS = (
    "What blocks capturing the decode step in a CUDA graph, read in model/qwen36, model/gdn, model/attention/layer.py "
    "and model/moe:",
    "the dynamic step (Qwen36Cache) cannot be replayed: each step returns new state tensors, the KV cache grows by "
    "torch.cat, and positions, RoPE and the causal mask come from the cache's length, a host integer. The static "
    "cache (model/qwen36/static_cache.py) removes all three: GDN states copied into fixed buffers, KV buffers of "
    "max_len positions written in place at a length held on the device, positions and the mask computed there; "
    "one captured step serves every length below max_len",
    "the batch checks (model/gdn/conv.py _check: the conv state's batch against the input's; the attention's on "
    "its KV cache) compare shapes on the host without reading the device: they do not stop a capture",
    "what still stops one is a path that reads the device on the host: the MoE expert paths `sorted` "
    "(counts.tolist()) and `reference` (unique().tolist()). The knobs pick `sorted` for 4 < B where no dispatch "
    "table applies (a CPU, a GPU without a table, a dtype its table was not measured in, e.g. float32 on the "
    "H200); the H200 table's triton_decode / triton_grouped and fla_recurrent capture. Such a B is reported as "
    "skipped with the capture's error: no path is substituted, so a graph time is always of the paths the eager "
    "column serves",
    "the serving platform runs eager because capture hangs there at TP=4; this command captures one rank's step, "
    "with no communication in it; `--no-graph` leaves the graph out",
)

GRAPH_METHOD = (
    "The graph column is the decode step over a static cache (model/qwen36/static_cache.py, static_step.py): the "
    f"prefill's cache copied into buffers of max_len = prefill + {CHECK_STEPS} positions; per layer the GDN state "
    "copied into its buffers, keys and values written at the device-side length, the attention over all max_len "
    "positions with later ones masked. It is captured once per B (after warm-up steps on a side stream) and "
    "replayed; each sample restores the state first, with the L2 flush, outside the timed span, so every sample is "
    "the same step at position prefill + 1, as in the eager column. `static eager` is that step run eagerly: "
    "static eager - eager is what the static cache costs (the state copies, attention over max_len keys), static "
    "eager - graph the host's launch cost the graph removes.",
    f"Checks: the replay's logits against the eager static step's over {CHECK_STEPS} greedy steps from one state, "
    "bit for bit (the same kernels); two eager runs of those steps against each other (whether the kernels are "
    "reproducible at all); the static step's logits against the dynamic step's (relative error: the masked "
    "attention sums over max_len keys where the dynamic one sums over prefill + 1, so its rounding differs; see "
    "model/attention/layer.py gated_attention_static).",
)


def floor_assumptions(meta: dict) -> list[str]:
    return [
        f"floor = bytes / HBM bandwidth ({meta['ceilings']['source']}); the arithmetic is not counted",
        f"every weight a block uses is read once per step, in {meta['dtype']}; the GDN recurrent state is float32 "
        "(mamba_ssm_dtype)",
        "moe: the router, the shared expert and its gate, and the routed experts the batch visits, estimated as "
        "E (1 - (1 - k/E)^B) of E experts (uniform routing; a skewed router visits fewer, so reads less)",
        "gdn: the conv window and the recurrent state read once and written back once",
        f"attention: K and V of all {meta['prefill'] + 1} positions (the prefill and the new token) read once, the "
        "new token's written once; this model's KV cache is copied whole each step (torch.cat), which the floor "
        "does not count",
        "norm: the two RMSNorms between blocks per layer and the final one; q/k norms and the GDN gated norm are "
        "counted with their mixer",
        "lm_head: this rank's vocab/tp rows read, B logit rows written; embed: B rows read",
        "each block's input read and output written once (nothing assumed to stay in L2 between blocks)",
        "one rank, no communication: at TP=4 each layer adds two all-reduces (after the mixer, after the MoE "
        "block), plus the embedding's all-reduce and the logits' gather; none is timed or in a floor",
    ]


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _size(nbytes: float | None) -> str:
    if nbytes is None:
        return "-"
    return f"{nbytes / 1e9:,.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:,.2f} MB"


def _kinds(rows) -> list[str]:
    present = {k for r in rows for k in (*r.kinds_us, *r.bytes)}
    return [k for k in KIND_ORDER if k in present]


def _layers(meta: dict) -> dict[str, int]:
    """How many blocks of each kind one step runs."""
    cfg = meta["rank_config"]
    types, layers = list(cfg["layer_types"]), cfg["num_hidden_layers"]
    moe = sum(1 for i in range(layers) if i not in cfg["mlp_only_layers"] and cfg["num_experts"] > 0
              and (i + 1) % cfg["decoder_sparse_step"] == 0)
    return {"moe": moe, "mlp": layers - moe, "gdn": types.count("linear_attention"),
            "attention": types.count("full_attention"), "norm": 2 * layers + 1, "lm_head": 1, "embed": 1}


def _timing_cell(t) -> str:
    return f"{t.median_us / 1e3:,.2f} ({t.spread:.0%})"


def _rate(batch: int, t) -> str:
    return "-" if t is None or t.median_us <= 0 else f"{batch / (t.median_us * 1e-6):,.0f}"


def _graph_cell(r) -> str:
    """The graph column: the replay's time, or what stands in its place (n/a, off, skipped, error)."""
    g = r.graph
    if g is None:
        return "-"
    if g.status == "ok":
        return _timing_cell(g.replay)
    return g.status if g.status.startswith(("n/a", "off")) else f"{g.status} (see below)"


def _step_cells(r) -> tuple[str, ...]:
    if r.status != "ok":
        return (str(r.batch), f"{r.status}: {r.detail}", "-", "-", "-", "-", "-", "-")
    floor = r.step_floor_us
    kernels = "n/a" if r.kernels is None else str(r.kernels["kernels"])
    replay = r.graph.replay if r.graph is not None else None
    return (str(r.batch), _timing_cell(r.step), _graph_cell(r), f"{r.tokens_per_s:,.0f}", _rate(r.batch, replay),
            kernels, _num(None if floor is None else floor / 1e3, ",.3f"),
            _num(None if floor is None else r.step.median_us / floor, ",.1f"))


STEP_HEADER = ("B", "eager ms (IQR/med)", "graph ms (IQR/med)", "tokens/s eager", "tokens/s graph", "kernels",
               "floor ms", "eager/floor")


def graph_notes(rows) -> list[str]:
    """One line per B whose graph column needs words: why it was not timed, or a replay that is not bit-equal."""
    notes = []
    for r in rows:
        g = r.graph
        if g is None:
            continue
        if g.status in ("skipped", "error"):
            notes.append(f"graph B={r.batch}: {g.status}: {g.detail}")
        elif g.status == "ok" and not g.replay_equals_eager:
            notes.append(f"graph B={r.batch}: the replay's logits differ from the eager static step's (max abs diff "
                         f"{g.replay_max_abs_diff:.3g}; eager reproducible: {_yes_no(g.eager_reproducible)})")
    return notes


def _yes_no(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "no"


def _kind_cell(r, kind: str) -> str:
    us, floor = r.kinds_us.get(kind), r.floor_us.get(kind)
    if us is None:
        return "-"
    return f"{us:,.0f}" + ("" if floor is None else f" ({floor:,.1f})")


def _aligned(table: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]


def format_step_table(meta: dict, rows) -> str:
    lines = [f"Decode step of one rank ({meta['dims']}, {meta['dtype']} on {meta['device']}; prefill "
             f"{meta['prefill']} tokens per sequence; router {meta.get('router')}, norm {meta.get('norm')})"]
    lines += _aligned([STEP_HEADER, *(_step_cells(r) for r in rows)])
    ok = [r for r in rows if r.status == "ok"]
    if ok:
        lines.append("Per block kind, us per step summed over the layers (floor us = bytes / HBM bandwidth):")
        lines += _aligned([("kind", *(f"B={r.batch}" for r in ok)),
                           *((k, *(_kind_cell(r, k) for r in ok)) for k in _kinds(ok))])
    lines += graph_notes(rows)
    lines += ops_notes(rows)
    lines.append(f"graph: {meta.get('graph_timing', '-')} (the report says how, and what blocks capture)")
    return "\n".join(lines)


def _markdown_table(header, body) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in body)]


def _kind_rows(r, layers: dict[str, int]) -> list[tuple[str, ...]]:
    out = []
    for kind in _kinds([r]):
        us, floor, nbytes = r.kinds_us.get(kind), r.floor_us.get(kind), r.bytes.get(kind)
        share = None if us is None or not r.instrumented_us else us / r.instrumented_us
        out.append((kind, layers.get(kind, "-"), _num(us, ",.1f"), _num(share, ".0%"),
                    _num(None if nbytes is None else nbytes / 1e6, ",.2f"), _num(floor, ",.2f"),
                    _num(None if us is None or not floor else us / floor, ",.1f")))
    return out


def _graph_row(r) -> tuple[str, ...]:
    g = r.graph
    return (str(r.batch), g.status, _num(g.max_len, "d"),
            "-" if g.static_eager is None else _timing_cell(g.static_eager),
            "-" if g.replay is None else _timing_cell(g.replay), _rate(r.batch, g.static_eager),
            _rate(r.batch, g.replay),
            _yes_no(g.replay_equals_eager) + ("" if g.replay_max_abs_diff in (None, 0.0)
                                               else f" (max abs diff {g.replay_max_abs_diff:.3g})"),
            _yes_no(g.eager_reproducible), _num(g.static_vs_dynamic, ".2e"), g.detail or "-")


OPS_HEADER = ("B", "eager ms direct", "eager ms through ops", "ops / direct", "static eager ms direct",
              "static eager ms through ops", "graph ms direct", "graph ms through ops", "ops / direct (graph)",
              "logits == direct (bits)", "replay == eager static (bits)", "detail")


def _ratio(a, b) -> str:
    return "-" if a is None or b is None or not b.median_us else f"{a.median_us / b.median_us:.3f}"


def _ops_row(r) -> tuple[str, ...]:
    """The step through the served ops beside the direct one (run.py ThroughOps)."""
    o, g = r.ops, r.graph
    og = o.graph
    cell = lambda t: "-" if t is None else _timing_cell(t)  # noqa: E731
    direct_static, direct_replay = (g.static_eager, g.replay) if g is not None else (None, None)
    ops_static, ops_replay = (og.static_eager, og.replay) if og is not None else (None, None)
    return (str(r.batch), cell(r.step), cell(o.step), _ratio(o.step, r.step), cell(direct_static), cell(ops_static),
            cell(direct_replay), cell(ops_replay), _ratio(ops_replay, direct_replay), _yes_no(o.equal),
            "-" if og is None else _yes_no(og.replay_equals_eager),
            o.detail or (og.detail if og is not None and og.detail else "-"))


def ops_notes(rows) -> list[str]:
    """The console's lines for the step through the served ops."""
    return [f"through the served ops B={r.batch}: eager {_ratio(r.ops.step, r.step)}x the direct step, graph "
            f"{_ratio(r.ops.graph.replay if r.ops.graph else None, r.graph.replay if r.graph else None)}x; logits equal "
            f"{_yes_no(r.ops.equal)}" + (f"; {r.ops.detail}" if r.ops.detail else "")
            for r in rows if r.ops is not None]


def write_step_report(directory: Path, meta: dict, rows) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    assumptions = floor_assumptions(meta)
    payload = {**meta, "graph_method": " ".join(GRAPH_METHOD), "graph_findings": " ".join(GRAPH_FINDINGS),
               "floor_assumptions": assumptions,
               "rows": [r.as_dict() for r in rows]}
    json_path = directory / "step.json"
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    cfg, layers = meta["rank_config"], _layers(meta)
    size = meta["weights"]["bytes"] if "weights" in meta else None
    md = [f"# `qwen36 tune step` on {meta['device']} ({meta['date']})", "",
          f"- command: `{meta['command']}`",
          f"- torch {meta['torch']}, dtype {meta['dtype']}, dims {meta['dims']}: one rank of TP={meta['tp']}, "
          f"{cfg['num_hidden_layers']} layers ({layers['gdn']} GDN, {layers['attention']} attention), hidden "
          f"{cfg['hidden_size']}, vocab {cfg['vocab_size']} per rank, {cfg['num_experts']} experts top-"
          f"{cfg['num_experts_per_tok']} (intermediate {cfg['moe_intermediate_size']} per rank), random weights "
          f"({_size(size)}, built in {meta.get('weights', {}).get('built_s', '-')} s)",
          f"- prefill {meta['prefill']} tokens per sequence, then the decode step at position {meta['prefill'] + 1}",
          f"- dispatch table: {meta.get('dispatch', '-')}",
          f"- timing: {meta['timing']}", f"- ceilings: {meta['ceilings']}", "",
          "## Decode step", ""]
    body = []
    for r in rows:
        cells = _step_cells(r)
        paths = ", ".join(f"{k} {v}" for k, v in r.paths.items()) or "-"
        k = r.kernels
        kernels = "n/a" if k is None else f"{k['kernels']} ({k['memcpy']} / {k['memset']})"
        spread = "-" if r.step is None else f"{r.step.p25_us / 1e3:,.2f} .. {r.step.p75_us / 1e3:,.2f}"
        body.append((cells[0], cells[1], spread, cells[3], cells[2], cells[4], kernels if r.status == "ok" else "-",
                     *cells[6:], paths))
    md += _markdown_table(("B", "eager ms (IQR/med)", "p25 .. p75 ms", "tokens/s eager", "graph ms (IQR/med)",
                           "tokens/s graph", "kernels (memcpy / memset)", "floor ms", "eager/floor", "paths served"),
                          body)
    md += ["", "tokens/s = B / the median step. Kernels: CUDA kernel events of one eager step under torch.profiler "
           "(n/a off CUDA). Graph: see Graph replay below.", ""]
    for r in rows:
        if r.status != "ok":
            continue
        md += [f"## Time per block kind, B={r.batch} (median of {meta['reps']} instrumented steps)", "",
               f"The instrumented step took {r.instrumented_us / 1e3:,.2f} ms, the timed one "
               f"{r.step.median_us / 1e3:,.2f} ms: the difference is the hook's own cost (two events or clock reads "
               "per block). `other`: time in no block (the host between blocks; the residual adds are in `norm`, one call with the norm after each).", ""]
        md += _markdown_table(("kind", "blocks per step", "us per step", "share", "MB read + written",
                               "floor us", "x floor"), _kind_rows(r, layers))
        md.append("")
    md += ["## Graph replay", "", f"Graph timing: {meta.get('graph_timing', '-')}.", "", *GRAPH_METHOD[:1], "",
           *GRAPH_METHOD[1:], ""]
    md += _markdown_table(("B", "graph", "max_len", "static eager ms (IQR/med)", "graph ms (IQR/med)",
                           "tokens/s static eager", "tokens/s graph",
                           f"replay == eager static (bits, {CHECK_STEPS} steps)",
                           "eager reproducible", "static vs dynamic logits (rel err)", "detail"),
                          [_graph_row(r) for r in rows if r.graph is not None])
    if any(r.ops is not None for r in rows):
        md += ["", "## Through the served ops", "", f"{meta.get('through_ops', '-')}: each served block (the residual "
               "add + RMSNorm, the GDN layer, the MoE block) is called through its op (`qwen36::served_*`, "
               "patches/model_paths/served_ops.py), whose layer is a stand-in calling the same block function, so "
               "the logits must equal the direct step's bit for bit and the difference in time is the ops' cost. "
               "Under a CUDA graph the ops' Python runs once, at capture.", ""]
        md += _markdown_table(OPS_HEADER, [_ops_row(r) for r in rows if r.ops is not None])
    md += ["", GRAPH_FINDINGS[0], "", *(f"- {line}" for line in GRAPH_FINDINGS[1:]), "",
           "## Floor assumptions", "", *(f"- {line}" for line in assumptions), ""]
    md_path = directory / "step.md"
    md_path.write_text("\n".join(md))
    return json_path, md_path
