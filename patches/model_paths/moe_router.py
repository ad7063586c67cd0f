"""MoE router substitution: the top-k routing of Qwen3-Next / Qwen3.5 MoE layers computed by `model.moe.ROUTERS`
instead of vLLM's routing code.

Why: the platform decodes eagerly, where every kernel launch costs host time. `triton_fused` routes in one Triton
launch (~41 us a call at T=1 on an H200, eager) where vLLM-style routing takes several (~135 us).

Seam (vLLM 0.32): fused_moe/router/. `create_fused_moe_router` builds a `CPURouter` on the CPU platform and, for
plain softmax top-k (no grouping, no correction bias, no custom function), a `FusedTopKRouter` elsewhere. Both
derive from `BaseRouter`, whose `_select_experts` calls `_compute_routing(hidden_states, router_logits,
indices_type, *, input_ids=None) -> (topk_weights, topk_ids)` and then itself captures the logical ids, applies
the EPLB logical-to-physical mapping and converts the ids to `indices_type`. `_compute_routing` is the narrowest
seam: logits in, routing out, and everything after it (capture, EPLB, ids dtype) stays vLLM's. It is wrapped on
those two classes only; the other routers compute other routing (grouped, biased, custom, simulated, zero-expert).
Their `__init__` is wrapped too: it decides once per layer whether the layer's routing is ours, while vLLM's config
is current (the model's architecture is known only then) and outside any traced forward, where a skipped layer can
be logged (as moe_experts decides at weight loading). A router built inside a traced forward (cpu_router's
`select_experts` helper for the monolithic CPU experts) keeps vLLM's routing.

Substituted: softmax scoring, top-k, renormalised (norm_topk_prob true), no correction bias, no grouped top-k, no
custom routing function, routed scaling 1, no hash routing, in a model of moe_experts.ARCHITECTURES. Every other
router keeps vLLM's routing; the first one skipped is logged with its reason.

Return contract, per class as vLLM's own `_compute_routing` returns it:
- weights float32 [T, k] and ids [T, k], both contiguous;
- CPURouter: int32 ids whatever `indices_type` (its `_softmax_topk`; `_select_experts` converts after);
- FusedTopKRouter: ids of `indices_type`, int32 when None (as `fused_topk` allocates them); rows vLLM marks as
  padding (VLLM_MOE_SKIP_PADDING and the forward context's `is_padding`, read by vLLM's own `_get_padding_mask`)
  get id -1, the sentinel that setting documents the experts drop (vllm/envs.py); their weights are left as
  computed, since the row is dropped.
Ties and order: model.moe ranks by float32 logit, the lower id first among equal logits (model/moe/router.py).
vLLM's CUDA kernel also prefers the lower id, but among equal probabilities; CPURouter's `torch.topk(sorted=False)`
leaves both the tie and the order of the k unspecified. The experts sum over the k, so the order never matters.
Weights are the softmax over the k float32 logits, equal to vLLM's renormalised softmax in exact arithmetic;
CPURouter computes it in the logits' dtype (bf16 when serving), ours in float32.

Path: `triton_fused` where it can run on the logits' device and dtype (`ROUTERS[...].unavailable_reason`), else
`topk_softmax`, chosen once per device and dtype. vLLM's CPU backend traces the model with Dynamo (the GPU runner
calls the fused MoE through its opaque `vllm.moe_forward` op): traced, the routing is one opaque torch op
(`qwen36::moe_route`), so the path choice, the count and the first-call log happen when it runs; eager callers call
it directly, sparing the op's dispatch. The first call of each path logs `ROUTED_LOG` (the layer count and path).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging
import re
from dataclasses import dataclass

import torch

from model.moe import ROUTERS

from ..core import seams
from ..core.registry import Patch
from .moe_experts import ARCHITECTURES

__all__ = ["PATCH", "SWITCH", "FAST_PATH", "FALLBACK_PATH", "ROUTED_LOG", "probe", "install", "uninstall",
           "substituted_layer_count", "routed_call_count", "routing_problem", "router_name_for"]

SWITCH = "QWEN36_PATCH_ROUTER"
FAST_PATH = "triton_fused"  # one Triton launch, where Triton runs on the logits' device
FALLBACK_PATH = "topk_softmax"  # torch ops, anywhere
COMPUTE_PARAMS = ("self", "hidden_states", "router_logits", "indices_type", "input_ids")
BASE_ROUTER = "vllm.model_executor.layers.fused_moe.router.base_router:BaseRouter"
# The first call of each path logs this line; the on/off server test reads it back.
ROUTED_LOG = re.compile(r"qwen36 moe_router: (\d+) layers routed by model\.moe (\w+)")

_ATTR = "_qwen36_routes"  # set on a router whose routing model.moe computes
_log = logging.getLogger("vllm.qwen36.patches.moe_router")  # under "vllm." to share vLLM's log handler


@dataclass(frozen=True)
class RouterSeam:
    """One vLLM router class the patch wraps, and what vLLM's routing there must be for ours to replace it."""

    module: str
    name: str
    # (attribute, value) pairs: the routing model.moe computes. A missing attribute is a changed vLLM: skipped.
    routing: tuple[tuple[str, object], ...]
    ids_follow_indices_type: bool  # False: int32 ids whatever indices_type (CPURouter)
    masks_padding: bool  # vLLM's padding rows get id -1 here (FusedTopKRouter's kernel)

    @property
    def path(self) -> str:
        return f"{self.module}:{self.name}"

    @property
    def init_params(self) -> tuple[str, ...]:
        # Constructor arguments named like the attributes (CPURouter stores hash_indices_table privately).
        return tuple(attr.lstrip("_") for attr, _ in self.routing)


_SOFTMAX_RENORMALISED = (("scoring_func", "softmax"), ("renormalize", True))
CPU_ROUTER = RouterSeam(
    "vllm.model_executor.layers.fused_moe.router.cpu_router", "CPURouter",
    (*_SOFTMAX_RENORMALISED, ("use_grouped_topk", False), ("e_score_correction_bias", None),
     ("custom_routing_function", None), ("routed_scaling_factor", 1.0), ("_hash_indices_table", None)),
    ids_follow_indices_type=False, masks_padding=False)
FUSED_TOPK_ROUTER = RouterSeam(
    "vllm.model_executor.layers.fused_moe.router.fused_topk_router", "FusedTopKRouter", _SOFTMAX_RENORMALISED,
    ids_follow_indices_type=True, masks_padding=True)
SEAMS = (CPU_ROUTER, FUSED_TOPK_ROUTER)
PADDING_MASK = f"{FUSED_TOPK_ROUTER.module}:_get_padding_mask"  # (num_tokens) -> bool [T] or None


class _State:
    originals: dict[str, tuple] = {}  # class name -> (__init__, _compute_routing)
    op = None
    layers = 0
    calls = 0
    logged_skip = False
    logged_paths: set[str] = set()
    paths: dict[tuple, tuple] = {}  # (device, dtype) -> (its ROUTERS entry, why not FAST_PATH or None)


def probe() -> str | None:
    """None when vLLM has both routers with the expected shape, else the reason the patch is not applicable."""
    problem = seams.first_problem(*(s.path for s in SEAMS), PADDING_MASK, BASE_ROUTER)
    if problem is not None:
        return problem
    for name in ("_compute_routing", "_apply_eplb_mapping"):  # ours first, then vLLM's EPLB mapping
        if (problem := seams.source_problem(f"{BASE_ROUTER}._select_experts", name)) is not None:
            return problem
    for seam in SEAMS:
        cls = seams.resolve(seam.path)
        init, compute = _State.originals.get(seam.name) or (cls.__dict__.get("__init__"), cls.__dict__.get(
            "_compute_routing"))
        if compute is None or init is None:
            return f"{seam.name} defines no {'_compute_routing' if compute is None else '__init__'} of its own"
        params = tuple(inspect.signature(compute).parameters)
        if params != COMPUTE_PARAMS:
            return f"{seam.name}._compute_routing{params} differs from the expected {COMPUTE_PARAMS}"
        missing = [p for p in seam.init_params if p not in inspect.signature(init).parameters]
        if missing:
            return f"{seam.name}.__init__ no longer takes {', '.join(missing)}: its routing options changed"
    return None


def install(settings) -> str:
    if not _State.originals:
        _route_op()  # registered here, never inside a traced forward
        for seam in SEAMS:
            cls = seams.resolve(seam.path)
            _State.originals[seam.name] = (cls.__init__, cls._compute_routing)
            cls.__init__ = _wrap_init(cls.__init__, seam, cls)
            cls._compute_routing = _wrap_compute_routing(cls._compute_routing, seam)
    return (f"{'/'.join(s.name for s in SEAMS)} routing of {', '.join(sorted(ARCHITECTURES))} (softmax, "
            f"renormalised, no bias, ungrouped) by model.moe.ROUTERS: {_path_detail()}")


def uninstall() -> None:
    """Restore vLLM's methods (tests). Routers built meanwhile keep their mark but route by vLLM again."""
    for seam in SEAMS:
        if seam.name in _State.originals:
            cls = seams.resolve(seam.path)
            cls.__init__, cls._compute_routing = _State.originals.pop(seam.name)


def substituted_layer_count() -> int:
    """Routers built (outside a traced forward) whose routing model.moe computes."""
    return _State.layers


def routed_call_count() -> int:
    """Calls that model.moe routed."""
    return _State.calls


def _path_detail() -> str:
    """The path this machine's device will take, asked of vLLM's platform (no CUDA context: the plugin also
    loads in the API server process)."""
    try:
        from vllm.platforms import current_platform

        device = "cuda" if current_platform.is_cuda_alike() else "cpu"
    except Exception:  # no vLLM platform here (tests)
        device = "cpu"
    why = ROUTERS[FAST_PATH].unavailable_reason(device, torch.bfloat16)
    return f"{FAST_PATH} on {device}" if why is None else f"{FALLBACK_PATH} on {device} ({FAST_PATH}: {why})"


def _architectures() -> set[str]:
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:
        return set()
    cfg = get_current_vllm_config_or_none()
    return set(getattr(getattr(cfg, "model_config", None), "architectures", None) or [])


_MISSING = object()


def _ineligible_reason(router, seam: RouterSeam) -> str | None:
    archs = _architectures()
    if not archs & ARCHITECTURES:
        return f"architecture {sorted(archs) or 'unknown'} is not one of {sorted(ARCHITECTURES)}"
    for attr, wanted in seam.routing:
        value = getattr(router, attr, _MISSING)
        if value is _MISSING:
            return f"{seam.name} has no attribute {attr} (vLLM changed; update patches/model_paths/moe_router.py)"
        if (value is not None) if wanted is None else (value != wanted):
            shown = "a tensor" if isinstance(value, torch.Tensor) else repr(value)
            return f"{attr}={shown} (model.moe routes with {attr}={wanted!r})"
    return None


def routing_problem(router) -> str | None:
    """None when model.moe routes exactly as `router` does (an instance of one of SEAMS' classes itself, in a model of
    ARCHITECTURES, with the routing model.moe computes), else why not. The served MoE block asks it too."""
    cls = type(router)
    seam = next((s for s in SEAMS if cls.__name__ == s.name and cls.__module__ == s.module), None)
    if seam is None:
        return f"router {cls.__name__} is not one of {', '.join(s.name for s in SEAMS)}"
    return _ineligible_reason(router, seam)


def router_name_for(device: torch.device, dtype: torch.dtype) -> str:
    """The model.moe router this patch routes with on `device` and `dtype` (FAST_PATH where it runs)."""
    return _path_for(device, dtype)[0].name


def _wrap_init(original, seam: RouterSeam, owner: type):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        if torch.compiler.is_compiling():
            return  # built inside a traced forward: nothing may be logged there, so it keeps vLLM's routing
        reason = (_ineligible_reason(self, seam) if type(self) is owner
                  else f"{type(self).__name__} subclasses {seam.name} and may route otherwise")
        if reason is None:
            setattr(self, _ATTR, True)
            _State.layers += 1
        elif not _State.logged_skip:
            _State.logged_skip = True
            _log.warning("qwen36 moe_router: a %s keeps vLLM's routing: %s", seam.name, reason)

    return __init__


def _path_for(device: torch.device, dtype: torch.dtype) -> tuple:
    """FAST_PATH where it can run on this device and dtype, else FALLBACK_PATH, with the reason; asked once."""
    key = (device, dtype)
    if key not in _State.paths:
        why = ROUTERS[FAST_PATH].unavailable_reason(device, dtype)
        _State.paths[key] = (ROUTERS[FAST_PATH] if why is None else ROUTERS[FALLBACK_PATH], why)
    return _State.paths[key]


def _route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 weights, int64 ids) [T, k] by model.moe, counted; the first call of a path logs ROUTED_LOG."""
    path, why_not_fast = _path_for(logits.device, logits.dtype)
    _State.calls += 1
    if path.name not in _State.logged_paths:  # one line per path and process: evidence of what ran
        _State.logged_paths.add(path.name)
        _log.info("qwen36 moe_router: %d layers routed by model.moe %s (first call: T=%d, %s logits on %s%s)",
                  _State.layers, path.name, logits.shape[0], logits.dtype, logits.device,
                  f"; {FAST_PATH}: {why_not_fast}" if why_not_fast else "")
    return path(logits, top_k)


def _route_op():
    """`_route` as one opaque torch op, for a forward Dynamo traces: inside it the routing runs eagerly each call."""
    if _State.op is None:
        @torch.library.custom_op("qwen36::moe_route", mutates_args=())
        def moe_route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
            weights, ids = _route(logits, top_k)
            return weights.contiguous(), ids.contiguous()

        @moe_route.register_fake
        def _(logits, top_k):
            shape = (*logits.shape[:-1], top_k)
            return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.int64)

        _State.op = moe_route
    return _State.op


def _wrap_compute_routing(original, seam: RouterSeam):
    # Looked up on its module at each call (tests replace it there); vLLM's own function, so its env and forward
    # context rules hold.
    padding = importlib.import_module(PADDING_MASK.partition(":")[0])

    @functools.wraps(original)
    def _compute_routing(self, hidden_states, router_logits, indices_type, *, input_ids=None):
        if not getattr(self, _ATTR, False):
            return original(self, hidden_states, router_logits, indices_type, input_ids=input_ids)
        route = _State.op if torch.compiler.is_compiling() else _route
        weights, ids = route(router_logits, self.top_k)
        ids_dtype = (indices_type or torch.int32) if seam.ids_follow_indices_type else torch.int32
        ids = ids.to(ids_dtype)
        if seam.masks_padding:
            mask = padding._get_padding_mask(ids.shape[0])
            if mask is not None:
                ids = ids.masked_fill(mask.unsqueeze(1), -1)
        return weights.contiguous(), ids.contiguous()

    return _compute_routing


PATCH = Patch(
    name="moe_router",
    seam=f"{CPU_ROUTER.name}/{FUSED_TOPK_ROUTER.name}._compute_routing/.__init__",
    required=False,  # an optimisation: without the seam (another vLLM) vLLM's routing is right, only slower
    switch=SWITCH,
    kind="compute",
    probe=probe,
    install=install,
    uninstall=uninstall,
)
