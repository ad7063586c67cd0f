"""`qwen36 tune step`'s outputs: a short console table, and step.json + step.md in the tune report directory."""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["format_step_table", "write_step_report", "GRAPH_FINDINGS", "KIND_ORDER"]

KIND_ORDER = ("moe", "mlp", "gdn", "attention", "norm", "lm_head", "embed", "other")

# What the code shows about capturing the step (model/qwen36/model.py, model/gdn, model/attention.py), checked
# by reading it; the report prints it in place of a graph-replay time.
GRAPH_FINDINGS = (
    "Not timed: the decode step is not served from a CUDA graph yet. Read in model/qwen36, model/gdn and "
    "model/attention.py, the usual reason ('the conv state's batch is checked against the cache and the state is "
    "rebuilt every step') is half right:",
    "the state is rebuilt every step: forward returns a new Qwen36Cache; conv_update and the rule paths allocate "
    "the next conv window and recurrent state; the KV cache grows by torch.cat, one position longer each step; "
    "positions, RoPE and the causal mask are built from the cache's length, a host integer. A captured step "
    "therefore replays one context length from fixed input addresses; serving from graphs needs state and KV "
    "buffers updated in place and a device-side length",
    "the batch checks (model/gdn/conv.py _check: the conv state's batch against the input's; gated_attention: "
    "the KV cache's) compare shapes on the host without synchronising the device: they do not stop a capture",
    "a capture does fail where the MoE path served at that B reads back to the host: `sorted` (counts.tolist()), "
    "what the knobs pick for 4 < B without a dispatch table (a CPU, or a GPU with no table, e.g. the BI-V100 "
    "today); the H200 table's triton_decode / triton_grouped and fla_recurrent do not (tune captured them)",
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


def _step_cells(r) -> tuple[str, ...]:
    if r.status != "ok":
        return (str(r.batch), f"{r.status}: {r.detail}", "-", "-", "-", "-")
    floor = r.step_floor_us
    kernels = "n/a" if r.kernels is None else str(r.kernels["kernels"])
    return (str(r.batch), f"{r.step.median_us / 1e3:,.2f} ({r.step.spread:.0%})", f"{r.tokens_per_s:,.0f}", kernels,
            _num(None if floor is None else floor / 1e3, ",.3f"),
            _num(None if floor is None else r.step.median_us / floor, ",.1f"))


STEP_HEADER = ("B", "step ms (IQR/med)", "tokens/s", "kernels", "floor ms", "step/floor")


def _kind_cell(r, kind: str) -> str:
    us, floor = r.kinds_us.get(kind), r.floor_us.get(kind)
    if us is None:
        return "-"
    return f"{us:,.0f}" + ("" if floor is None else f" ({floor:,.1f})")


def _aligned(table: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]


def format_step_table(meta: dict, rows) -> str:
    lines = [f"Decode step of one rank ({meta['dims']}, {meta['dtype']} on {meta['device']}; eager; prefill "
             f"{meta['prefill']} tokens per sequence; router {meta.get('router')}, norm {meta.get('norm')})"]
    lines += _aligned([STEP_HEADER, *(_step_cells(r) for r in rows)])
    ok = [r for r in rows if r.status == "ok"]
    if ok:
        lines.append("Per block kind, us per step summed over the layers (floor us = bytes / HBM bandwidth):")
        lines += _aligned([("kind", *(f"B={r.batch}" for r in ok)),
                           *((k, *(_kind_cell(r, k) for r in ok)) for k in _kinds(ok))])
    lines.append("graph: not timed (see the report: what blocks serving the step from a graph)")
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


def write_step_report(directory: Path, meta: dict, rows) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    assumptions = floor_assumptions(meta)
    payload = {**meta, "graph": " ".join(GRAPH_FINDINGS), "floor_assumptions": assumptions,
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
          f"- timing: {meta['timing']}", f"- ceilings: {meta['ceilings']}", "",
          "## Decode step", ""]
    body = []
    for r in rows:
        cells = _step_cells(r)
        paths = ", ".join(f"{k} {v}" for k, v in r.paths.items()) or "-"
        k = r.kernels
        kernels = "n/a" if k is None else f"{k['kernels']} ({k['memcpy']} / {k['memset']})"
        spread = "-" if r.step is None else f"{r.step.p25_us / 1e3:,.2f} .. {r.step.p75_us / 1e3:,.2f}"
        body.append((cells[0], cells[1], spread, cells[2], kernels if r.status == "ok" else "-", *cells[4:], paths))
    md += _markdown_table(("B", "step ms (IQR/med)", "p25 .. p75 ms", "tokens/s", "kernels (memcpy / memset)",
                           "floor ms", "step/floor", "paths served"), body)
    md += ["", "tokens/s = B / the median step. Kernels: CUDA kernel events of one step under torch.profiler "
           "(n/a off CUDA).", ""]
    for r in rows:
        if r.status != "ok":
            continue
        md += [f"## Time per block kind, B={r.batch} (median of {meta['reps']} instrumented steps)", "",
               f"The instrumented step took {r.instrumented_us / 1e3:,.2f} ms, the timed one "
               f"{r.step.median_us / 1e3:,.2f} ms: the difference is the hook's own cost (two events or clock reads "
               "per block). `other`: time in no block (the residual adds, the host between blocks).", ""]
        md += _markdown_table(("kind", "blocks per step", "us per step", "share", "MB read + written",
                               "floor us", "x floor"), _kind_rows(r, layers))
        md.append("")
    md += ["## Graph replay", "", GRAPH_FINDINGS[0], "", *(f"- {line}" for line in GRAPH_FINDINGS[1:]), "",
           "## Floor assumptions", "", *(f"- {line}" for line in assumptions), ""]
    md_path = directory / "step.md"
    md_path.write_text("\n".join(md))
    return json_path, md_path
