"""The served blocks as opaque torch ops, so that they serve a compiled vLLM (torch.compile, CUDA graphs) as they
serve an eager one.

Why: a compiled vLLM traces each layer's forward once (the CPU backend: Dynamo, mode DYNAMO_TRACE_ONCE; GPUs:
vLLM's piecewise compile) and replays the graph for every token count. A Python choice made while tracing would be
frozen into the graph for every later call, and vLLM traces before it binds the layers' state caches. So under
tracing each substitute emits one call of its op here (`qwen36::served_<block>`, with a fake implementation giving
the output's shape and dtype); at run time the op looks its layer up by name and runs the substitute's eager
forward, which makes the per-call choice (table, token count, dtype) and falls back to vLLM's own forward, exactly
as an eager server does. This is vLLM's own way (`direct_register_custom_op` and `no_compile_layers`), kept
without vLLM: the layer lookup is this module's, so the ops run on a machine without vLLM (the GPU tests).

Eager servers never go through the ops: the substitutes call their eager forward directly (an op call costs host
time an eager platform pays per layer).

CUDA graphs: the op's Python runs once per captured batch size, at capture; what it launched is replayed. So each
captured size keeps the choice the table makes for that size. The GDN layer op reads this step's metadata (decode
only or not), which a piecewise graph must not freeze: it is one of vLLM's splitting ops (`register_splitting_op`,
as vLLM's own GDN core op is), so piecewise graphs run it eagerly between their pieces; a full graph (decode-only
batches) captures it with the decode step's metadata.

What a mode serves is logged once per process when the model is built (`log_mode_once`): the status table that the
plugin logs at load cannot know the mode, which vLLM's config sets later.
"""
from __future__ import annotations

import itertools
import logging
import weakref
from dataclasses import dataclass

import torch
import torch._dynamo  # assume_constant_result

__all__ = ["LIBRARY", "OPS", "GDN_OP", "name_layer", "layer_named", "serves_here", "who_serves", "routes",
           "served_add_rms_norm", "served_gated_norm", "served_gdn_layer", "served_moe_block", "register_splitting_op",
           "ServerMode", "server_mode", "log_mode_once", "mode_line", "mode_problem"]

LIBRARY = "qwen36"
GDN_OP = f"{LIBRARY}::served_gdn_layer"
OPS = {"add_rms_norm": f"{LIBRARY}::served_add_rms_norm", "gdn_gated_norm": f"{LIBRARY}::served_gated_norm",
       "gdn_layer_decode": GDN_OP, "moe_block": f"{LIBRARY}::served_moe_block"}

_log = logging.getLogger("vllm.qwen36.patches.served_blocks")  # under "vllm." to share vLLM's log handler

# name -> the substitute layer. Weak: a layer a test builds and drops leaves no entry behind.
_LAYERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_COUNTER = itertools.count()


def name_layer(layer: torch.nn.Module, block: str) -> str:
    """A name the ops find `layer` by (`<block>.<n>`, unique in the process), kept on the layer."""
    name = layer.__dict__.get("_qwen36_op_name")
    if name is None:
        name = f"{block}.{next(_COUNTER)}"
        layer.__dict__["_qwen36_op_name"] = name
        _LAYERS[name] = layer
    return name


def layer_named(name: str) -> torch.nn.Module:
    layer = _LAYERS.get(name)
    if layer is None:
        raise RuntimeError(f"qwen36 served op: no layer named {name!r} in this process (a graph traced in another "
                           "process, or its layer was freed)")
    return layer


@torch._dynamo.assume_constant_result
def serves_here(serving, device: torch.device, dtype: torch.dtype) -> bool:
    """`serving.may_serve(device, dtype)` asked while Dynamo traces, its answer a constant of the graph: it is fixed
    for a process (the device's table and the switches), unlike the per-call choice the op makes."""
    return serving.may_serve(device, dtype)


def who_serves(serving, device: torch.device) -> str:
    """What the device's table (and forcing) choose for `serving`'s block, for its mode line."""
    from .served_choice import forced, table_rows_detail

    rows = table_rows_detail(serving.block, device)
    return f"forced: the model's path where the table leaves vLLM's ({rows})" if forced() else rows


def routes(*blocks: str) -> str:
    """How the blocks are called in each mode, for their status row."""
    return f"eager: direct calls; compiled: the op{'s' if len(blocks) > 1 else ''} {', '.join(OPS[b] for b in blocks)}"


def _fresh(out: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """`out`, copied where it shares memory with an input: an op's outputs may not alias its inputs (vLLM's own
    forward, the fallback, may return a view)."""
    ptr = out.untyped_storage().data_ptr()
    return out.clone() if any(t.untyped_storage().data_ptr() == ptr for t in inputs) else out


@torch.library.custom_op(OPS["add_rms_norm"], mutates_args=())
def served_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, layer: str) -> tuple[torch.Tensor, torch.Tensor]:
    normed, h_new = layer_named(layer)._qwen36_eager(x, residual)
    return _fresh(normed, x, residual), _fresh(h_new, x, residual)


@served_add_rms_norm.register_fake
def _(x, residual, layer):
    return torch.empty_like(x), torch.empty_like(x)


@torch.library.custom_op(OPS["gdn_gated_norm"], mutates_args=())
def served_gated_norm(x: torch.Tensor, z: torch.Tensor, layer: str) -> torch.Tensor:
    return _fresh(layer_named(layer)._qwen36_eager(x, z), x, z)


@served_gated_norm.register_fake
def _(x, z, layer):
    return torch.empty_like(x)


@torch.library.custom_op(GDN_OP, mutates_args=())
def served_gdn_layer(hidden_states: torch.Tensor, layer: str) -> torch.Tensor:
    # The state caches it advances are the layer's (vLLM's own ops read them so too), not arguments.
    return _fresh(layer_named(layer)._qwen36_eager(hidden_states), hidden_states)


@served_gdn_layer.register_fake
def _(hidden_states, layer):
    return torch.empty_like(hidden_states)


@torch.library.custom_op(OPS["moe_block"], mutates_args=())
def served_moe_block(hidden_states: torch.Tensor, router_logits: torch.Tensor, layer: str) -> torch.Tensor:
    return _fresh(layer_named(layer)._qwen36_eager(hidden_states, router_logits), hidden_states, router_logits)


@served_moe_block.register_fake
def _(hidden_states, router_logits, layer):
    return torch.empty_like(hidden_states)


def register_splitting_op() -> str:
    """Add the GDN layer op to vLLM's splitting ops (the list a compilation config copies when it is built: install
    runs before), so piecewise CUDA graphs leave it eager as they leave vLLM's GDN core. A detail for the status."""
    try:
        from vllm.config.compilation import CompilationConfig
    except ImportError as exc:
        return f"no vLLM compilation config here ({exc})"
    ops = getattr(CompilationConfig, "_attention_ops", None)
    if not isinstance(ops, list):
        return "vLLM's CompilationConfig has no _attention_ops list: piecewise CUDA graphs would freeze the GDN op"
    if GDN_OP not in ops:
        ops.append(GDN_OP)
    return f"{GDN_OP} splits piecewise graphs"


# --- the server's mode -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerMode:
    name: str  # "eager", "compiled" or "compiled with CUDA graphs"
    detail: str  # how vLLM runs the model
    piecewise: bool = False  # piecewise CUDA graphs (split at vLLM's splitting ops)
    splitting_ops: tuple[str, ...] = ()


def server_mode(vllm_config) -> ServerMode:
    """The mode `vllm_config` runs the model in, read as vLLM reads it."""
    compilation = vllm_config.compilation_config
    mode = getattr(compilation.mode, "name", str(compilation.mode))
    eager = bool(getattr(vllm_config.model_config, "enforce_eager", False)) if vllm_config.model_config else False
    if mode == "NONE" or eager:
        return ServerMode("eager", "torch.compile off: --enforce-eager or compilation mode NONE")
    graphs = getattr(compilation, "cudagraph_mode", None)
    graph_name = getattr(graphs, "name", "NONE") if graphs is not None else "NONE"
    sizes = list(getattr(compilation, "cudagraph_capture_sizes", None) or [])
    detail = f"torch.compile mode {mode}, backend {compilation.backend or 'inductor'}"
    if graph_name == "NONE" or not sizes:
        return ServerMode("compiled", detail + "; no CUDA graphs")
    piecewise = "PIECEWISE" in graph_name
    return ServerMode("compiled with CUDA graphs", f"{detail}; CUDA graphs {graph_name} at batch sizes "
                      f"{sizes[0]}-{sizes[-1]} ({len(sizes)} sizes)", piecewise,
                      tuple(compilation.splitting_ops or ()))


def mode_problem(block: str, mode: ServerMode) -> str | None:
    """Why `block` cannot serve in `mode`, or None. Every mode serves the blocks through their ops but for this: a
    piecewise graph would freeze the GDN layer op (its fallback, vLLM's prefill, included) unless the op splits it."""
    if block == "gdn_layer_decode" and mode.piecewise and GDN_OP not in mode.splitting_ops:
        return (f"piecewise CUDA graphs without {GDN_OP} among the splitting ops (a --compilation-config that sets "
                "splitting_ops: add it there) would freeze one step's choice into the graph")
    return None


def _route(block: str, mode: ServerMode) -> str:
    if mode.name == "eager":
        return "direct calls, the choice per call"
    route = f"through the opaque op {OPS[block]}, the choice per call at run time"
    if mode.name == "compiled with CUDA graphs":
        route += "; each captured batch size replays the choice its capture made"
        if block == "gdn_layer_decode" and mode.piecewise:
            route += "; eager between piecewise graphs (a splitting op)"
    return route


def mode_line(block: str, who: str, mode: ServerMode) -> str:
    """What serves `block` in `mode`: `who` (what the table and the switches choose) and how it is called, or why
    vLLM's own serves in this mode."""
    problem = mode_problem(block, mode)
    how = f"vLLM's own in this mode: {problem}" if problem is not None else f"{who}; {_route(block, mode)}"
    return f"qwen36 served {block} in this server's mode, {mode.name} ({mode.detail}): {how}"


class _Logged:
    blocks: set = set()


def log_mode_once(block: str, who) -> ServerMode | None:
    """At the first layer of `block` vLLM builds in this process: log its mode line and return the mode (None where
    no vLLM config is being built: a test building a layer alone). `who()` says what the table chooses."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:
        return None
    config = get_current_vllm_config_or_none()
    if config is None:
        return None
    mode = server_mode(config)
    if block not in _Logged.blocks:
        _Logged.blocks.add(block)
        _log.info("%s", mode_line(block, who(), mode))
    return mode
