"""One served decode step's operator launches, counted from vLLM's own torch profiler, per block kind.

A launch-bound platform (the BI-V100 runs eager) pays per operator its host dispatches, so the operators of one
decode step are the figure the patch set's served blocks exist to cut. Counting them is free of timing noise.

How: a server started with `profiler_args(dir)` (vLLM's `--profiler-config`, torch profiler, Python stacks on) does
nothing more until `POST /start_profile`; then B requests decode together (after one unprofiled round of the
same, so one-off first-call work stays out), `POST /stop_profile` makes the worker
write its trace into `dir`. In the trace the worker marks each step with a `user_annotation`
`execute_context_<prefill requests>(<tokens>)_generation_<decode requests>(<tokens>)`: a decode step of B requests
is `execute_context_0(0)_generation_B(B)`. Every `cpu_op` event inside such a step is counted (as vLLM's profiler
records them: an op and the ops it calls each count once), and attributed to the block kind of the innermost
enclosing module (`nn.Module: <class>_<n>` events, which the profiler records with Python stacks on) whose class
names a kind; ops under no such module (embedding, logits, the decoder layer's own glue) are `other`.

Those counts depend on the CPU as much as on the code: vLLM's CPU build takes other kernels, packs other weights and
keeps its GDN state in another dtype on an AVX2-only CPU than with AVX-512 BF16. So each step also counts what the
plugin itself calls (`plugin`), which does not: the operators called from the plugin's own Python code (its frames
are `model/...` and `patches/...` in the trace's Python stacks) at the top level (not inside another operator), by
the block kind around them. The innermost frame of the plugin's or vLLM's decides whose an operator is (torch's and
the standard library's frames between are passed through), so vLLM's projections inside a served layer stay
vLLM's. Operators whose schema may return their input itself (views, `reshape`, `contiguous`, `to`) and bare
allocations are not counted: whether they copy depends on the layout and dtype vLLM chose on this CPU.
"""
from __future__ import annotations

import functools
import gzip
import json
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness.errors import HarnessError

__all__ = ["KINDS", "NO_KERNEL", "StepCount", "profiler_args", "block_kind", "computes", "decode_step_counts",
           "profile_decode_steps", "count_growth"]

# Block kinds, by the class of the innermost enclosing module; checked in this order.
KINDS = ("norm", "gdn", "moe", "attention", "other")
_KIND_OF_CLASS = (
    ("norm", re.compile(r"RMSNorm")),  # GemmaRMSNorm, RMSNormGated and the plugin's Served* subclasses
    ("gdn", re.compile(r"GatedDeltaNet")),
    ("moe", re.compile(r"MoE|Moe|RoutedExperts|Router")),
    ("attention", re.compile(r"Attention|Rotary")),
)
_MODULE_EVENT = re.compile(r"^nn\.Module: (\w+?)_\d+$")
# The served blocks' opaque ops (patches/model_paths/served_ops.py), which a compiled server calls in place of the
# substitutes' Python: not counted themselves, and not an operator holding others, so the plugin's calls inside them
# count as the eager server's do; the op names the block kind (a compiled graph records no module events).
SERVED_OP = re.compile(r"^qwen36::served_(\w+)$")
_KIND_OF_SERVED_OP = {"add_rms_norm": "norm", "gated_norm": "norm", "gdn_layer": "gdn", "moe_block": "moe"}
# torch.compile's record_function markers, which the profiler files as cpu_op (`## Call CompiledFxGraph <hash> ##`
# around a compiled graph's run): markers, not operators, so neither counted nor holding what runs inside them.
_MARKER = re.compile(r"^## .* ##$")
# Python frames as the profiler names them (`model/moe/router.py(82): route_topk_softmax`): the plugin's own code, and
# vLLM's. Any other frame (torch's, the standard library's, a built-in call) is passed through to its caller.
PLUGIN_FRAMES = ("model/", "patches/")
VLLM_FRAMES = ("vllm/",)
# ATen ops that move no data: allocations and metadata (views are recognised by their schema).
NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach",
                       "alias", "_reshape_alias", "set_", "resize_", "_unsafe_view", "view", "as_strided"})
_STEP = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")


def profiler_args(trace_dir: Path | str) -> tuple[str, ...]:
    """vLLM's arguments for a torch profiler writing into `trace_dir` (absolute, as vLLM requires); idle until
    /start_profile."""
    config = {"profiler": "torch", "torch_profiler_dir": str(Path(trace_dir).resolve()),
              "torch_profiler_with_stack": True}
    return ("--profiler-config", json.dumps(config, separators=(",", ":")))


@functools.cache
def computes(op: str) -> bool:
    """Whether a traced operator (`aten::mm`, `_C::onednn_mm`) is counted as work: not the profiler's own, not a bare
    allocation, not an ATen op whose schema may return its input itself (a view, `reshape`, `contiguous`, `to`)."""
    namespace, _, name = op.partition("::")
    if namespace == "profiler" or _MARKER.match(op):
        return False
    if namespace != "aten":
        return True
    if name in NO_KERNEL:
        return False
    import torch

    packet = getattr(torch.ops.aten, name, None)
    return packet is None or not any(getattr(packet, o).is_view for o in packet.overloads())


def block_kind(module_class: str) -> str | None:
    for kind, pattern in _KIND_OF_CLASS:
        if pattern.search(module_class):
            return kind
    return None


@dataclass(frozen=True)
class StepCount:
    """The operators of the decode steps of `batch` requests in one profile: per kind (and in total) the fewest and
    the most any step ran, all of them (`ranges`) and the plugin's own calls (`plugin`, module docstring). Equal where
    the count is deterministic; a path whose launches depend on the data (the CPU MoE dispatcher's `sorted` path
    loops over the experts a step routes to) gives a range."""

    batch: int
    steps: int
    ranges: dict[str, tuple[int, int]]  # kind or "total" -> (fewest, most)
    plugin: dict[str, tuple[int, int]]  # the same, of the plugin's own top-level calls

    @property
    def total(self) -> int:
        return self.ranges["total"][1]

    def as_json(self) -> dict:
        """kind -> the count, or [fewest, most] where the steps differed; `plugin` the same, of the plugin's calls."""
        return {**_as_json(self.ranges), "plugin": _as_json(self.plugin)}


def _as_json(ranges: dict[str, tuple[int, int]]) -> dict:
    return {k: (lo if lo == hi else [lo, hi]) for k, (lo, hi) in
            ((k, ranges.get(k, (0, 0))) for k in ("total", *KINDS))}


def _events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f).get("traceEvents", [])


def _count_step(step: dict, ops: list[dict], modules: list[dict]) -> Counter:
    """`ops` and `modules` of one thread, each sorted by start. A module's interval holds its sub-modules'
    (Python calls nest), so one sweep with a stack of the open modules finds each op's innermost one."""
    start, end = step["ts"], step["ts"] + step["dur"]
    counts: Counter = Counter()
    open_modules: list[dict] = []
    pending = iter(m for m in modules if start <= m["ts"] and m["ts"] + m["dur"] <= end)
    upcoming = next(pending, None)
    for op in ops:
        if op["ts"] < start:
            continue
        if op["ts"] > end:
            break
        while upcoming is not None and upcoming["ts"] <= op["ts"]:
            while open_modules and open_modules[-1]["end"] < upcoming["ts"]:
                open_modules.pop()
            open_modules.append({"end": upcoming["ts"] + upcoming["dur"], "kind": upcoming["kind"]})
            upcoming = next(pending, None)
        while open_modules and open_modules[-1]["end"] < op["ts"]:
            open_modules.pop()
        counts[open_modules[-1]["kind"] if open_modules else "other"] += 1
    return counts


def _frame_owner(name: str) -> str | None:
    """'plugin' or 'vllm' for a Python frame of either's code, else None (passed through)."""
    if name.startswith(PLUGIN_FRAMES):
        return "plugin"
    return "vllm" if name.startswith(VLLM_FRAMES) else None


def _plugin_calls(step: dict, events: list[dict]) -> Counter:
    """The step's top-level operators called from the plugin's code, by block kind. `events`: one thread's
    python_function and cpu_op events sorted by (start, -duration), so that an event comes after those holding it."""
    start, end = step["ts"], step["ts"] + step["dur"]
    counts: Counter = Counter()
    stack: list[tuple[float, dict]] = []  # the open events, innermost last, with their ends
    open_ops = 0
    for e in events:
        if e["ts"] < start:
            continue
        if e["ts"] > end:
            break
        e_end = e["ts"] + e["dur"]
        while stack and stack[-1][0] < e_end:
            open_ops -= stack.pop()[1]["cat"] == "cpu_op"
        served = SERVED_OP.match(e["name"]) if e["cat"] == "cpu_op" else None
        if served:  # transparent (SERVED_OP): its kind and owner for the calls inside it
            e = {**e, "cat": "served_op", "kind": _KIND_OF_SERVED_OP.get(served.group(1), "other"), "owner": None}
        elif e["cat"] == "cpu_op" and _MARKER.match(e["name"]):
            e = {**e, "cat": "marker"}
        elif e["cat"] == "cpu_op":
            if not open_ops and computes(e["name"]):
                owner = next((o for o in (x.get("owner") for _, x in reversed(stack)) if o), None)
                if owner == "plugin":
                    counts[next((x["kind"] for _, x in reversed(stack) if x.get("kind")), "other")] += 1
            open_ops += 1
        stack.append((e_end, e))
    return counts


def decode_step_counts(trace_files: list[Path], batch: int) -> StepCount:
    """Per kind, the fewest and the most operators any decode step of exactly `batch` requests ran."""
    per_step: list[Counter] = []
    plugin_per_step: list[Counter] = []
    for path in trace_files:
        events = [e for e in _events(path) if e.get("ph") == "X" and "dur" in e]
        for thread in {(e.get("pid"), e.get("tid")) for e in events}:
            mine = [e for e in events if (e.get("pid"), e.get("tid")) == thread]
            ops = sorted((e for e in mine if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
            modules, frames = [], []
            for e in mine:
                if e.get("cat") != "python_function":
                    continue
                match = _MODULE_EVENT.match(e["name"])
                kind = block_kind(match.group(1)) if match else None
                if kind:
                    modules.append({"ts": e["ts"], "dur": e["dur"], "kind": kind})
                frames.append({**e, "kind": kind, "owner": _frame_owner(e["name"])})
            modules.sort(key=lambda m: m["ts"])
            nested = sorted(frames + ops, key=lambda e: (e["ts"], -e["dur"]))
            for e in mine:
                step = _STEP.match(e["name"]) if e.get("cat") == "user_annotation" else None
                if step and int(step.group(1)) == 0 and int(step.group(3)) == batch:
                    per_step.append(_count_step(e, ops, modules))
                    plugin_per_step.append(_plugin_calls(e, nested))
    if not per_step:
        raise HarnessError(f"no decode step of {batch} requests (execute_context_0(0)_generation_{batch}(...)) in "
                           f"{[str(p) for p in trace_files]}: did the requests decode together?")
    return StepCount(batch, len(per_step), _ranges(per_step), _ranges(plugin_per_step))


def _ranges(per_step: list[Counter]) -> dict[str, tuple[int, int]]:
    """Per kind and in total, the fewest and the most of the steps' counts."""
    for counts in per_step:
        counts["total"] = sum(counts[k] for k in KINDS)
    return {k: (min(c[k] for c in per_step), max(c[k] for c in per_step)) for k in ("total", *KINDS)}


def _post(client: httpx.Client, url: str) -> None:
    r = client.post(url, timeout=300)
    if r.status_code != 200:
        raise HarnessError(f"{url} answered {r.status_code}: {r.text[:300]} (was the server started with "
                           "profiler_args?)")


def _new_traces(trace_dir: Path, before: set[Path], wait_s: float = 120.0) -> list[Path]:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        found = sorted(p for p in trace_dir.rglob("*.json*") if p not in before)
        if found and all(p.stat().st_size > 0 for p in found):
            time.sleep(1.0)  # the writer may still be closing the file
            return found
        time.sleep(0.5)
    raise HarnessError(f"no trace appeared in {trace_dir} within {wait_s:.0f} s of /stop_profile")


def profile_decode_steps(base_url: str, model: str, trace_dir: Path | str, batch: int, *,
                         api_key: str | None = None, max_tokens: int = 8) -> StepCount:
    """Profile `batch` requests decoding together on a server started with profiler_args(trace_dir)."""
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    before = set(trace_dir.rglob("*.json*"))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0}

    def together(client: httpx.Client) -> None:
        with ThreadPoolExecutor(max_workers=batch) as pool:
            answers = list(pool.map(lambda i: client.post(
                f"{base_url}/v1/completions", timeout=300,
                json={**body, "prompt": f"Request {i}: count to ten, one number a line."}), range(batch)))
        bad = [a for a in answers if a.status_code != 200]
        if bad:
            raise HarnessError(f"{base_url}: {len(bad)} of {batch} profiled requests failed: {bad[0].text[:300]}")

    with httpx.Client(headers=headers) as client:
        # Once unprofiled first: the first step of a new batch size runs one-off work (first-call checks and
        # allocations; 484 more operators in the GDN layers of the tiny model's first B = 8 step, 2026-12-06).
        together(client)
        _post(client, f"{base_url}/start_profile")
        try:
            together(client)
        finally:
            _post(client, f"{base_url}/stop_profile")
    return decode_step_counts(_new_traces(trace_dir, before), batch)


def count_growth(recorded: dict, measured: dict) -> list[str]:
    """The gate's findings for one (server, batch), on StepCount.as_json's counts or on their `plugin` part: each
    kind, or the total, whose deterministic count grew (with the difference) or stopped being deterministic. A kind
    recorded as a range (data-dependent launches) is not gated: its count moves with the routing, not with the
    code."""
    findings = []
    for kind in ("total", *KINDS):
        was, now = recorded.get(kind, 0), measured.get(kind, 0)
        if isinstance(was, list):
            continue
        if isinstance(now, list):
            findings.append(f"{kind}: {was} -> {now[0]}..{now[1]} (deterministic before, now varies between steps)")
        elif now > was:
            findings.append(f"{kind}: {was} -> {now} (+{now - was})")
    return findings
