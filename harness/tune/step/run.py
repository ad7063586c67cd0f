"""`qwen36 tune step`: the whole decode step of one tensor-parallel rank, eager and (on CUDA) as a CUDA graph.

The platform serves eager (CUDA-graph capture hangs there at TP=4), so what a user feels per token is a decode
step's eager time: the kernels plus the host's cost of launching them. This builds the whole text model at
one rank's dims with random weights drawn on the device (nothing downloaded), prefills `--step-prefill`
tokens per sequence, then at each `--step-batches` B times the next decode step (`--reps` samples after
`--warmup` steps, L2 flushed before each, CUDA events; the host clock on a CPU), counts the kernels one step
launches (CUDA: torch.profiler), and splits instrumented steps by block kind through model.qwen36's `trace`
hook, each kind beside its HBM floor (harness/tune/measure/floors.py `decode_step_bytes`). Then the same step over a
static cache (harness/tune/step/graph.py): eager, and on CUDA captured in a CUDA graph and replayed, checked bit
for bit against the eager static step (`--no-graph`: eager only). One rank's work only: the all-reduces (two per
layer), the embedding's all-reduce and the logits' gather are not in it.
"""
from __future__ import annotations

import datetime as dt
import shlex
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from model.attention.decode_layer import served_attention_decode_layer
from model.dispatch.table import table_choice_for, table_file_name
from model.gdn import select_conv_path, select_gated_norm_path, select_rule_path, served_decode_layer
from model.moe import ROUTERS, select_block_path, select_expert_path
from model.norm.rms_norm import ADD_RMS_NORM_PATHS, GATED_NORM_PATHS, RMS_NORM_PATHS, compute_dtype
from model.qwen36 import ConfigError, Qwen36Config, Qwen36Model, Qwen36Paths

from ..measure.ceilings import ceilings_for
from ..measure.floors import Work, decode_step_bytes, floor_of
from ..measure.inputs import generator, rank_config, rank_weights
from ..measure.launch_count import launches_of_call
from ..measure.point import Settings
from ..measure.progress import Progress
from ..measure.timing import L2Flusher, Timing, time_eager, warm_device
from .graph import GraphResult, measure_static_step
from .report import format_step_table, write_step_report
from .through_ops import through_served_ops

__all__ = ["run_step", "model_config", "BlockClock", "StepRow", "STEP_BATCHES", "STEP_PREFILL",
           "QWEN36_35B_A3B", "TINY_MODEL"]

STEP_BATCHES = (1, 8, 64)
STEP_PREFILL = 256

# Qwen3.6-35B-A3B's text config, the fields model.qwen36 reads (the checkpoint's config.json has the same values):
# 40 layers, every 4th full attention (layers 3, 7, ..., 39), the rest Gated DeltaNet; the sparse MoE block with
# a shared expert in every layer. For text the interleaved mRoPE is plain NeoX RoPE on the first quarter.
QWEN36_35B_A3B = {
    "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
    "full_attention_interval": 4, "rms_norm_eps": 1e-6,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
}
# The same ratios in 4 layers (one of them attention), seconds on a CPU; at TP=4 its MoE and GDN dims per rank
# are harness/tune/measure/dims.py's TINY.
TINY_MODEL = {
    **QWEN36_35B_A3B, "vocab_size": 512, "hidden_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16,
    "linear_num_key_heads": 8, "linear_num_value_heads": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
}


class StepError(RuntimeError):
    """A batch size could not be timed; the message says why."""


def model_config(a) -> tuple[str, Qwen36Config]:
    """(name, the whole model's config): a checkpoint's config.json with --hf-config, else --dims."""
    if a.hf_config is not None:
        return Path(a.hf_config).name, Qwen36Config.from_pretrained_dir(a.hf_config)
    if a.dims == "real":
        return "qwen3.6-35b-a3b", Qwen36Config.from_hf_dict(QWEN36_35B_A3B)
    return "tiny", Qwen36Config.from_hf_dict(TINY_MODEL)


class BlockClock:
    """The model's `trace` hook: each block kind's time in one forward, summed over the layers. On CUDA an
    event on each side of a block: the time between the stream reaching them, i.e. the block's kernels plus
    any wait for the host to launch them (the eager cost); on a CPU the host clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: list[tuple[str, object, object]] = []

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def between_us(self, start, end) -> float:
        """Microseconds from one mark to a later one (on CUDA: after the device has passed both)."""
        return start.elapsed_time(end) * 1e3 if self.cuda else (end - start) * 1e6

    @contextmanager
    def __call__(self, kind: str):
        start = self.mark()
        yield
        self.spans.append((kind, start, self.mark()))

    def totals_us(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for kind, start, end in self.spans:
            totals[kind] += self.between_us(start, end)
        return dict(totals)


@dataclass
class StepRow:
    batch: int
    context: int  # tokens each sequence has seen once this step's token is in
    status: str = "ok"  # ok | error
    detail: str = ""
    step: Timing | None = None
    instrumented_us: float | None = None  # the median instrumented step (the hook's own cost included)
    kinds_us: dict[str, float] = field(default_factory=dict)  # median per kind, plus "other": outside any block
    bytes: dict[str, float] = field(default_factory=dict)
    floor_us: dict[str, float | None] = field(default_factory=dict)
    kernels: dict[str, int] | None = None  # None: not counted (no CUDA)
    paths: dict[str, str] = field(default_factory=dict)
    graph: GraphResult | None = None  # the static-cache step, eager and replayed (None: not reached)
    # The same steps with the served blocks called through the plugin's ops (step/through_ops.py); None: not reached.
    ops: "ThroughOps | None" = None

    @property
    def tokens_per_s(self) -> float | None:
        return self.batch / (self.step.median_us * 1e-6) if self.step and self.step.median_us > 0 else None

    @property
    def step_floor_us(self) -> float | None:
        known = [f for f in self.floor_us.values() if f is not None]
        return sum(known) if known and len(known) == len(self.floor_us) else None

    def as_dict(self) -> dict:
        return {"batch": self.batch, "context": self.context, "status": self.status, "detail": self.detail,
                "step": self.step.as_dict() if self.step else None, "tokens_per_s": self.tokens_per_s,
                "kernels": self.kernels, "instrumented_us": self.instrumented_us, "kinds_us": self.kinds_us,
                "bytes": self.bytes, "floor_us": self.floor_us, "step_floor_us": self.step_floor_us,
                "paths": self.paths, "graph": self.graph.as_dict(self.batch) if self.graph else None,
                "through_ops": self.ops.as_dict(self.batch) if self.ops else None}


@dataclass
class ThroughOps:
    """The decode step with the served blocks called through their ops, beside the direct one: the eager dynamic
    step, and the static step eager and replayed; `equal`: its logits against the direct step's, bit for bit."""

    step: Timing | None = None
    equal: bool | None = None
    graph: GraphResult | None = None
    detail: str = ""

    def as_dict(self, batch: int) -> dict:
        return {"step": self.step.as_dict() if self.step else None, "logits_equal_direct": self.equal,
                "graph": self.graph.as_dict(batch) if self.graph else None, "detail": self.detail}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_blocks(step, s: Settings) -> tuple[float, dict[str, float]]:
    """(median instrumented step us, median us per block kind and "other") over `s.reps` steps, each from a
    flushed L2 and an idle device, as the timed steps start."""
    totals, per_kind = [], defaultdict(list)
    for _ in range(s.reps):
        s.flusher.flush()
        _sync(s.device)
        clock = BlockClock(s.device)
        begin = clock.mark()
        step(clock)
        end = clock.mark()
        _sync(s.device)
        total, kinds = clock.between_us(begin, end), clock.totals_us()
        totals.append(total)
        for kind, us in kinds.items():
            per_kind[kind].append(us)
        per_kind["other"].append(total - sum(kinds.values()))
    return statistics.median(totals), {k: statistics.median(v) for k, v in per_kind.items()}


def profile_kernels(step, device: torch.device) -> dict[str, int] | None:
    """Device work one step launches, from torch.profiler; None off CUDA (a CPU launches no kernels)."""
    return launches_of_call(step, device) if device.type == "cuda" else None


def model_paths(a, device: torch.device, dtype: torch.dtype) -> Qwen36Paths:
    """The model's paths with --router and --norm put in, each checked to run here (ValueError saying why not)."""
    default = Qwen36Paths()
    router, norm = a.router or default.router, a.norm or default.norm
    forced = ((ROUTERS, router), (RMS_NORM_PATHS, norm), (ADD_RMS_NORM_PATHS, norm), (GATED_NORM_PATHS, norm))
    for table, name in forced:
        if name is None:  # the model's default: nothing forced
            continue
        if name not in table:
            raise ValueError(f"no {table.what} {name!r}; registered: {', '.join(sorted(table))}")
        table.checked(name, 1, dtype, device)
    return Qwen36Paths(moe=default.moe, router=router, gdn_rule=default.gdn_rule, gdn_conv=default.gdn_conv,
                       attention_core=default.attention_core, norm=norm)


def _paths(model: Qwen36Model, batch: int, s: Settings) -> dict[str, str]:
    """The registered path each block serves this batch's decode step with (the device's table or the knobs):
    the whole-block path, and the router and experts only where the MoE block is composed, the rule, conv and
    gated norm only where the GDN decode layer is staged, the attention core where the attention is staged."""
    cfg, mp = model.config, model.paths
    paths = {"add_rms_norm": mp.between_blocks_norm(batch, s.device, s.dtype)}
    if any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers)):
        paths["moe_block"] = mp.moe_block or select_block_path(batch, s.device, s.dtype, mp.moe)
        if paths["moe_block"] == "composed":
            paths["router"] = mp.router
            paths["moe_experts"] = select_expert_path(batch, mp.moe, s.device, s.dtype)
    if "linear_attention" in cfg.layer_types:
        paths["gdn_decode_layer"] = served_decode_layer(
            batch, s.device, s.dtype, rule=mp.gdn_rule, conv=mp.gdn_conv, norm=mp.norm,
            decode_layer=mp.gdn_decode_layer) or "staged"
        if paths["gdn_decode_layer"] == "staged":
            paths["gdn_rule"] = mp.gdn_rule or select_rule_path(1, batch, s.device, s.dtype)
            paths["gdn_conv"] = mp.gdn_conv or select_conv_path(1, s.device, s.dtype)
            paths["gdn_gated_norm"] = mp.norm or select_gated_norm_path(batch, s.device, s.dtype)
    if "full_attention" in cfg.layer_types:
        paths["attention_decode_layer"] = served_attention_decode_layer(
            batch, s.device, s.dtype, core=mp.attention_core, norm=mp.norm,
            decode_layer=mp.attention_decode_layer) or "staged"
        if paths["attention_decode_layer"] == "staged":
            paths["attention_core"] = mp.attention_core or "sdpa"
    return paths


def prefilled(model: Qwen36Model, batch: int, prefill: int, device: torch.device) -> tuple[torch.Tensor, object]:
    """(the next token ids [batch, 1], the cache) after `prefill` seeded random tokens per sequence."""
    # Token ids from this rank's slice of the vocabulary (the per-rank embedding holds vocab/tp rows).
    prompt = torch.randint(0, model.config.vocab_size, (batch, prefill), generator=generator(device, 90_000 + batch),
                           device=device)
    logits, cache = model.forward(prompt)
    if not torch.isfinite(logits[:, -1]).all():
        raise StepError("the prefill's logits are not finite: the random weights' scales "
                        "(harness/tune/measure/inputs.py rank_weights) let activations overflow at these dims; lower "
                        "them there")
    return logits[:, -1].argmax(-1, keepdim=True), cache


def measure_batch(model: Qwen36Model, batch: int, prefill: int, s: Settings, ceilings, tick,
                  through_ops: bool = True) -> StepRow:
    cfg = model.config
    row = StepRow(batch, prefill + 1)
    elem, state_elem = s.dtype.itemsize, compute_dtype(s.dtype).itemsize
    row.bytes = decode_step_bytes(cfg, batch, row.context, elem, state_elem)
    row.floor_us = {k: floor_of(Work(b, 0.0), ceilings).hbm_us for k, b in row.bytes.items()}
    row.paths = _paths(model, batch, s)
    tick(f"B={batch}: prefill {prefill} tokens")
    ids, cache = prefilled(model, batch, prefill, s.device)
    # Every sample is the same step, at position prefill + 1 from the prefilled cache (the model never
    # modifies a cache it is given).
    tick(f"B={batch}: {s.reps} timed decode steps")
    row.step = time_eager(lambda: model.forward(ids, cache), s.device, s.flusher, s.reps, s.warmup)
    step_logits = model.forward(ids, cache)[0]
    if not torch.isfinite(step_logits).all():
        raise StepError("the decode step's logits are not finite: lower the weight scales in "
                        "harness/tune/measure/inputs.py rank_weights")
    tick(f"B={batch}: {s.reps} instrumented steps")
    row.instrumented_us, row.kinds_us = time_blocks(lambda clock: model.forward(ids, cache, trace=clock), s)
    if s.device.type == "cuda":
        tick(f"B={batch}: kernels of one step (torch.profiler)")
    row.kernels = profile_kernels(lambda: model.forward(ids, cache), s.device)
    try:  # a failure here costs the graph column only: the eager results above stand
        row.graph = measure_static_step(model, cache, ids, step_logits, s, tick)
    except Exception as exc:
        row.graph = GraphResult("error", f"{type(exc).__name__}: {str(exc).strip()[:300]}")
        print(f"qwen36 tune step: B={batch}: the static-cache step failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
    if through_ops:
        row.ops = measure_through_ops(model, cache, ids, step_logits, s, tick)
    return row


def measure_through_ops(model: Qwen36Model, cache, ids: torch.Tensor, step_logits: torch.Tensor, s: Settings,
                        tick) -> ThroughOps:
    """The step with the served blocks through the plugin's ops (step/through_ops.py), timed as the direct one."""
    ops_model = Qwen36Model(model.weights, model.paths, call_blocks=through_served_ops())
    result = ThroughOps()
    try:
        tick(f"B={ids.shape[0]}: {s.reps} timed decode steps through the served ops")
        result.step = time_eager(lambda: ops_model.forward(ids, cache), s.device, s.flusher, s.reps, s.warmup)
        result.equal = torch.equal(ops_model.forward(ids, cache)[0], step_logits)
        result.graph = measure_static_step(ops_model, cache, ids, step_logits, s, tick)
    except Exception as exc:  # the direct step's results stand
        result.detail = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        print(f"qwen36 tune step: B={ids.shape[0]}: the step through the served ops failed: {result.detail}",
              file=sys.stderr)
    return result


def _refused_flags(a) -> list[str]:
    flags = {"--check": a.check, "--check-stale": a.check_stale, "--ab": a.ab, "--add-run": a.add_run,
             "--add-run-from": a.add_run_from, "--sweep-configs": a.sweep_configs}
    return [flag for flag, on in flags.items() if on]


def run_step(a) -> int:
    refused = _refused_flags(a)
    if refused:
        print(f"qwen36 tune step: {', '.join(refused)} gate or sweep the dispatch table; `step` only times the "
              "decode step: drop them, or run them without `step`", file=sys.stderr)
        return 2
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, a.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    try:
        model_name, full = model_config(a)
        cfg = rank_config(full, a.tp)
        paths = model_paths(a, device, dtype)
    except (ConfigError, ValueError) as exc:
        print(f"qwen36 tune step: {exc}", file=sys.stderr)
        return 2
    batches, prefill = a.step_batches or STEP_BATCHES, a.step_prefill or STEP_PREFILL
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    stem = table_file_name(name).removesuffix(".json")
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    report_dir = Path(a.report_dir or Path("runs") / "tune" / f"{stem}-{today}")
    ceilings = ceilings_for(stem, a.hbm_tbps, a.peak_tflops)
    graphs = device.type == "cuda" and not a.no_graph
    s = Settings(device, dtype, a.reps, a.warmup, graphs, L2Flusher(device, a.flush_mb * 2**20))
    through_ops = not a.no_through_ops
    per_step = 4 + (device.type == "cuda") + graphs + through_ops * (2 + graphs)
    progress = Progress(1 + per_step * len(batches), enabled=not a.no_progress, unit="phase")
    meta = {
        "device": name, "device_stem": stem, "date": today, "torch": torch.__version__,
        "command": shlex.join(getattr(a, "invocation", None) or ["qwen36", *sys.argv[1:]]),
        "dtype": str(dtype).removeprefix("torch."), "model": model_name, "tp": a.tp,
        "router": paths.router, "norm": paths.norm or "served",
        # which table the served paths come from, or why none does (then: the command that records one)
        "dispatch": table_choice_for(device).detail,
        "dims": f"{model_name}-tp{a.tp}", "rank_config": {k: v for k, v in vars(cfg).items()},
        "prefill": prefill, "batches": list(batches), "reps": a.reps, "warmup": a.warmup,
        "ceilings": {"hbm_bytes_per_s": ceilings.hbm_bytes_per_s, "source": ceilings.source},
        "timing": (f"eager; median of {a.reps} steps (spread = IQR / median) after {a.warmup} warm-up steps; before "
                   f"each a {a.flush_mb} MB buffer is written (L2 flush) and the device synchronised; CUDA events"
                   if device.type == "cuda" else
                   f"eager; median of {a.reps} host-clock steps (spread = IQR / median) after {a.warmup} warm-up "
                   "steps"),
        "graph_timing": ("CUDA graph replay of the static-cache step, timed as the eager step is" if graphs else
                         "off (--no-graph)" if device.type == "cuda" else "n/a (CUDA only)"),
        "through_ops": ("the same steps with the served blocks called through the plugin's ops, timed the same way"
                        if through_ops else "off (--no-through-ops)"),
    }
    print(f"qwen36 tune step: dispatch table: {meta['dispatch']}")
    rows: list[StepRow] = []
    try:
        progress.tick(f"random weights at {meta['dims']}")
        started = time.perf_counter()
        try:
            weights = rank_weights(cfg, dtype, device)
            _sync(device)
        except Exception as exc:
            print(f"qwen36 tune step: building the random weights at {meta['dims']} on {name} failed: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        meta["weights"] = {"bytes": sum(t.numel() * t.element_size() for t in _tensors(weights)),
                           "built_s": round(time.perf_counter() - started, 2)}
        model = Qwen36Model(weights, paths)
        warm_device(device)
        for batch in batches:
            try:
                rows.append(measure_batch(model, batch, prefill, s, ceilings, progress.tick, through_ops))
            except (Exception, KeyboardInterrupt) as exc:
                rows.append(StepRow(batch, prefill + 1, "error", f"{type(exc).__name__}: {str(exc).strip()[:300]}"))
                print(f"qwen36 tune step: B={batch} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                if isinstance(exc, KeyboardInterrupt):
                    break
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            write_step_report(report_dir, meta, rows)  # after each batch: a stopped run keeps what it measured
    finally:
        progress.close()
    json_path, md_path = write_step_report(report_dir, meta, rows)
    print(format_step_table(meta, rows))
    print(f"report: {md_path} and {json_path.name}")
    return 0 if rows and all(r.status == "ok" for r in rows) else 1


def _tensors(weights):
    """Every tensor of a Qwen36Weights (for its size in bytes)."""
    yield from (weights.embed, weights.final_norm, weights.lm_head)
    for layer in weights.layers:
        yield from (layer.input_norm, layer.post_norm)
        for block in (layer.mixer, layer.mlp):
            yield from (t for t in (getattr(block, f.name) for f in fields(block)) if isinstance(t, torch.Tensor))
