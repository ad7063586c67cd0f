"""`qwen36 tune moe --sweep-configs`: each Triton expert path's candidate block configs (configs/space.py) timed at
every token count the path takes, with the same measurement as the path sweep (NaN-poisoned output checked
against the float64 reference, eager and graph replay, L2 flushed), then the fastest correct config per T
next to the registered one and the table to paste (configs/choice.py).

configs/space.py imports triton, so it is loaded only once `why_no_config_sweep` found the Triton paths able to
run here; this module itself imports without triton.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Callable, Mapping

from model.moe import EXPERT_PATHS

from ..blocks.moe import expert_point, measure_expert_fn
from ..measure.ceilings import Ceilings
from ..measure.dims import MoEDims
from ..measure.inputs import moe_weights
from ..measure.point import Measurement, Settings
from ..measure.prune import Pruner
from ..table.report import Section
from .choice import choose, config_expr, pasteable_table, summary_lines
from .precompile import precompile

__all__ = ["why_no_config_sweep", "config_sweep_steps", "sweep_configs", "config_sweep_section"]

TRITON_PATHS = ("triton_decode", "triton_grouped")  # space.TRITON_KERNELS, named without importing triton
INTERPRETER_HINT = ("TRITON_INTERPRET=1 qwen36 tune moe --sweep-configs --device cpu --dims tiny --moe-tokens 1,4 "
                    "--reps 3 (checks the sweep; its times say nothing about a GPU)")


def why_no_config_sweep(target: str, device, dtype, dims_name: str) -> str | None:
    """Why the sweep cannot run as asked, with what to run instead; None when it can."""
    if target != "moe":
        return (f"--sweep-configs times the MoE Triton kernels only, and the target here is {target}: run "
                f"`qwen36 tune moe --sweep-configs`")
    for path in TRITON_PATHS:
        why = EXPERT_PATHS[path].unavailable_reason(device, dtype)
        if why:
            return (f"the Triton expert path {path} cannot run on {device} in {dtype}: {why}. Run the sweep on the "
                    f"GPU that serves; on a CPU only through the interpreter: {INTERPRETER_HINT}")
    if device.type != "cuda" and dims_name != "tiny":
        return (f"Triton's interpreter runs every program as Python: at dims {dims_name} the sweep would take hours. "
                f"Add --dims tiny: {INTERPRETER_HINT}")
    return None


def _kernels():
    from .space import TRITON_KERNELS

    return TRITON_KERNELS


def _points(kernel, tokens_list, s: Settings) -> list[int]:
    return [t for t in tokens_list if EXPERT_PATHS[kernel.path].supports(t, s.dtype, s.device)]


def _precompiling(s: Settings, workers: int) -> bool:
    """Only compiled Triton gains from it: the interpreter compiles nothing."""
    return workers > 1 and s.device.type == "cuda"


def config_sweep_steps(tokens_list, s: Settings, workers: int) -> int:
    """Progress steps: one per candidate at each point, one for the precompiling."""
    steps = sum(len(k.candidates(t)) for k in _kernels() for t in _points(k, tokens_list, s))
    return steps + _precompiling(s, workers)


def sweep_configs(d: MoEDims, tokens_list, s: Settings, ceilings: Ceilings, pruners: Mapping[str, Pruner],
                  tick: Callable[[str], None], rows: list[Measurement], notes: list[str], workers: int) -> None:
    """Appends to `rows` as it goes (a sweep stopped half way keeps what it measured). The registered config
    is timed at every point; other candidates leave larger points once `pruners[path]` drops them."""
    kernels = _kernels()
    w = moe_weights(d, s.dtype, s.device)
    if _precompiling(s, workers):
        configs = {k.path: list(dict.fromkeys(c for t in _points(k, tokens_list, s) for c in k.candidates(t)))
                   for k in kernels}
        tick(f"compiling {sum(map(len, configs.values()))} configs in {workers} processes")
        first = {k.path: min(_points(k, tokens_list, s), default=1) for k in kernels}
        notes.append(precompile(configs, first, d, s.dtype, s.device, workers))
    for kernel in kernels:
        pruner = pruners[kernel.path]
        for tokens in _points(kernel, tokens_list, s):
            p = expert_point(d, tokens, s, ceilings, w)
            registered = kernel.registered(tokens)
            candidates = kernel.candidates(tokens)
            here = []
            for i, config in enumerate(candidates, 1):
                tick(f"{kernel.path} T={tokens} config {i}/{len(candidates)}")
                expr = config_expr(config)
                if config != registered and not pruner.keeps(expr, tokens):
                    continue
                m = measure_expert_fn(kernel.block, expr, kernel.path, partial(kernel.run, config=config), p, w, s)
                m.extra.update(config=dataclasses.asdict(config), registered=config == registered)
                here.append(m)
                rows.append(m)
            pruner.update(here)


def config_sweep_section(rows: list[Measurement], prefer_graph: bool, ranked_by: str) -> Section:
    """Per Triton path: the choice at each point, the wrong candidates, the table to paste."""
    data, lines = {}, []
    for kernel in _kernels():
        choices = choose(rows, kernel.block, prefer_graph)
        if not choices:
            continue
        winners = {t: c.chosen for t, c in choices.items() if c.chosen}
        python = pasteable_table(kernel.table, kernel.config_type.__name__, winners) if winners else None
        wrong = [f"- WRONG at T={r.key}: {r.path}: {r.detail}" for r in rows
                 if r.block == kernel.block and r.status == "wrong"]
        data[kernel.path] = {"source": kernel.source, "table": kernel.table, "interpreted": kernel.interpreted,
                             "points": {t: c.as_dict() for t, c in choices.items()}, "python": python}
        lines += [f"### {kernel.path}: `{kernel.table}` in `{kernel.source}`", "", *summary_lines(choices), ""]
        lines += wrong + ([""] if wrong else [])
        if kernel.interpreted:
            lines += ["Timed under Triton's CPU interpreter: the times say nothing about a GPU; do not paste.", ""]
        if python:
            apply = (f"To apply, replace `{kernel.table}` in `{kernel.source}` with (then run the GPU tests and "
                     "`qwen36 tune moe`, which records the dispatch table with the new configs):")
            lines += [apply, "", "```python", python, "```", ""]
    title = f"Triton block configs, ranked by {ranked_by}: the fastest correct one per T and the registered one"
    return Section("config_sweep", title, data, lines)
