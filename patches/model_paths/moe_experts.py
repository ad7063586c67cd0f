"""MoE expert-path substitution: the routed experts of Qwen3-Next / Qwen3.5 MoE layers computed by
`model.moe.dispatch_experts` instead of vLLM's fused-MoE kernel.

Seam (vLLM 0.32): `UnquantizedFusedMoEMethod` in fused_moe/unquantized_fused_moe_method.py, a `CustomOp`
(`unquantized_fused_moe`). Through vLLM's out-of-tree registry (patches/core/oot.py) vLLM builds our subclass
wherever it builds that method; on a vLLM without the registry (an older build, such as the platform's CoreX vLLM
may be) the same two methods are wrapped on vLLM's class instead, and the status row says which seam serves.
- `process_weights_after_loading(layer)` is overridden: before vLLM converts `w13_weight [E, 2I, H]` (gate rows
  first) and `w2_weight [E, H, I]` to its kernel layout (the CPU backend pads and prepacks them), we keep a
  reference to the HF-layout tensors. If vLLM left them in place (same storage, same shape) we drop the
  reference and read the live parameters, so no memory is doubled; otherwise the reference keeps one copy.
- `apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)` is overridden: for layers
  prepared above it returns the routed-expert output of the dispatcher. Routing (topk_weights/ids) stays
  vLLM's; the shared expert stays vLLM's: the runner computes it before `apply` unless the kernel was to
  overlap it, in which case we call it exactly as the kernel does (SharedExpertsOrder.MK_INTERNAL_OVERLAPPED,
  which computes only in that case). The tensor-parallel all-reduce stays in vLLM's runner, after `apply`.
Layers the dispatcher cannot serve (other architectures, biases, non-SiLU, expert parallelism, router weight
on input, pre-processed weights) keep vLLM's path; the first such layer is logged with the reason.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from model.moe import MoEConfig, select_expert_path
from model.moe.config import TINY_MAX_LIMIT

from ..core import oot
from ..core.registry import Patch
from ..core.seams import signature_problem

__all__ = ["PATCH", "SWITCH", "ARCHITECTURES", "dispatch_rule", "uninstall", "substituted_layer_count"]

SWITCH = "QWEN36_PATCH_MOE"

SEAM_MODULE = "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method"
SEAM_CLASS = "UnquantizedFusedMoEMethod"
ORDER_MODULE = "vllm.model_executor.layers.fused_moe.runner.shared_experts"
APPLY_PARAMS = ("self", "layer", "x", "topk_weights", "topk_ids", "shared_experts", "shared_experts_input")
PWAL_PARAMS = ("self", "layer")
# Models whose routed experts are softmax-top-k SiLU experts with HF gate-first w13, as model.moe computes.
ARCHITECTURES = frozenset({
    "Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
})

_ATTR = "_qwen36_moe_weights"
_log = logging.getLogger("vllm.qwen36.patches.moe_experts")  # under "vllm." to share vLLM's log handler


@dataclass
class _HFWeights:
    w13: torch.Tensor | None  # None: read the live layer.w13_weight (vLLM kept the HF layout)
    w2: torch.Tensor | None


class _State:
    originals: dict[str, object] = {}
    layers = 0
    logged_skip = False
    logged_paths: set[str] = set()


def _seam_class():
    import importlib

    return getattr(importlib.import_module(SEAM_MODULE), SEAM_CLASS)


def probe() -> str | None:
    """None when vLLM has the seam with the expected shape, else the reason it is not applicable."""
    import importlib

    try:
        module = importlib.import_module(SEAM_MODULE)
    except ImportError as exc:
        return f"{SEAM_MODULE} cannot be imported ({exc})"
    cls = getattr(module, SEAM_CLASS, None)
    if cls is None:
        return f"{SEAM_MODULE} has no {SEAM_CLASS}"
    for name, expected in (("apply", APPLY_PARAMS), ("process_weights_after_loading", PWAL_PARAMS)):
        reason = signature_problem(f"{SEAM_CLASS}.{name}", _State.originals.get(name) or getattr(cls, name, None),
                                   expected)
        if reason is not None:
            return reason
    try:
        order = importlib.import_module(ORDER_MODULE).SharedExpertsOrder
        order.MK_INTERNAL_OVERLAPPED  # noqa: B018 - the shared-expert contract the wrapper relies on
    except (ImportError, AttributeError) as exc:
        return f"shared-expert order {ORDER_MODULE}.SharedExpertsOrder.MK_INTERNAL_OVERLAPPED missing ({exc})"
    return None


def enabled(settings) -> tuple[bool, str]:
    if not settings.is_on("moe_experts"):
        return False, f"opt-in: {SWITCH}=1 turns it on"
    if not settings.moe.native:
        return False, f"{SWITCH}=1 but MOE_NATIVE=0: vLLM's fused MoE stays in place"
    return True, ""


def install(settings) -> str:
    config = _Runtime.config = settings.moe  # the dispatcher picks a path per token count from it
    registry_reason = oot.registry_reason(SEAM_MODULE, SEAM_CLASS)
    if registry_reason is None:
        oot.register(_seam_class(), served_class())
        seam = "registry: unquantized_fused_moe"
    else:
        _wrap_vllms_methods()
        seam = f"method seam ({registry_reason})"
    return (f"{seam}: routed experts of {', '.join(sorted(ARCHITECTURES))} by model.moe.dispatch_experts "
            f"({dispatch_rule(config)}); dispatch table: {_table_detail()}")


@functools.cache
def served_class() -> type:
    """vLLM's UnquantizedFusedMoEMethod with the two overrides, for the registry; built once, so a second install
    registers the same class."""
    in_tree = _seam_class()
    return type("ServedUnquantizedFusedMoEMethod", (in_tree,), {
        "__doc__": "vLLM's unquantized MoE method; the routed experts of eligible layers by model.moe.",
        "__module__": __name__,
        "process_weights_after_loading": _wrap_pwal(in_tree.process_weights_after_loading),
        "apply": _wrap_apply(in_tree.apply),
    })


def _wrap_vllms_methods() -> None:
    """The fallback where vLLM has no registry: the same overrides wrapped onto vLLM's own class."""
    cls = _seam_class()
    if not _State.originals:
        _State.originals = {"apply": cls.apply, "process_weights_after_loading": cls.process_weights_after_loading}
        cls.process_weights_after_loading = _wrap_pwal(_State.originals["process_weights_after_loading"])
        cls.apply = _wrap_apply(_State.originals["apply"])


def dispatch_rule(config: MoEConfig) -> str:
    """The path model.moe.select_expert_path picks per token count T under `config` where no dispatch
    table decides, asked of the dispatcher itself: e.g. `T=1: decode_fused, T=2..8: tiny_bmm, T>=9: sorted`.
    ENGINEX_MOE_TINY_MAX is at most TINY_MAX_LIMIT, so from TINY_MAX_LIMIT + 1 on the knobs pick one path."""
    runs: list[list] = []  # [first T, last T, path]
    for t in range(1, TINY_MAX_LIMIT + 2):
        path = select_expert_path(t, config)
        if runs and runs[-1][2] == path:
            runs[-1][1] = t
        else:
            runs.append([t, t, path])
    *closed, (last_from, _, last_path) = runs
    parts = [f"T={a}: {p}" if a == b else f"T={a}..{b}: {p}" for a, b, p in closed]
    return ", ".join([*parts, f"T>={last_from}: {last_path}" if closed else f"every T: {last_path}"])


def _device_name() -> str | None:
    """The GPU's name without creating a CUDA context (the plugin also loads in the API server process)."""
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cuda_alike():
            return current_platform.get_device_name(0)
        return None
    except Exception:  # no vLLM platform here (tests): ask torch only if CUDA is already up
        return torch.cuda.get_device_name() if torch.cuda.is_initialized() else None


def _table_detail() -> str:
    """The dispatch table the experts will use on this machine's device (model.dispatch.table), or why none.
    A QWEN36_DISPATCH_TABLE naming a missing or broken file raises: the row then says `failed` and why."""
    from model.dispatch.table import choose_table

    return choose_table(_device_name()).detail


def uninstall() -> None:
    """Give vLLM its class back in the registry and restore its methods (tests)."""
    if oot.registry_reason(SEAM_MODULE, SEAM_CLASS) is None:
        oot.unregister(_seam_class(), served_class())
    if _State.originals:
        cls = _seam_class()
        cls.apply = _State.originals["apply"]
        cls.process_weights_after_loading = _State.originals["process_weights_after_loading"]
        _State.originals = {}


def substituted_layer_count() -> int:
    return _State.layers


def _architectures() -> set[str]:
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:
        return set()
    cfg = get_current_vllm_config_or_none()
    archs = getattr(getattr(cfg, "model_config", None), "architectures", None) or []
    return set(archs)


def _ineligible_reason(method, layer) -> str | None:
    archs = _architectures()
    if not archs & ARCHITECTURES:
        return f"architecture {sorted(archs) or 'unknown'} is not one of {sorted(ARCHITECTURES)}"
    if getattr(method.moe, "has_bias", False):
        return "expert biases"
    activation = getattr(getattr(layer, "activation", None), "value", None)
    if activation != "silu":
        return f"activation {activation!r} (the dispatcher computes SiLU-gated experts)"
    if getattr(layer, "expert_map", None) is not None:
        return "expert parallelism (expert_map set)"
    if getattr(layer, "apply_router_weight_on_input", False):
        return "router weight applied on input"
    try:
        from vllm.model_executor.utils import is_weights_pre_processed

        if is_weights_pre_processed():
            return "weights loaded pre-processed (already in vLLM's kernel layout)"
    except ImportError:
        pass
    e, two_i, h = layer.w13_weight.shape
    if tuple(layer.w2_weight.shape) != (e, h, two_i // 2):
        return f"w13 {tuple(layer.w13_weight.shape)} and w2 {tuple(layer.w2_weight.shape)} are not [E,2I,H]/[E,H,I]"
    return None


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


def _wrap_pwal(original):
    @functools.wraps(original)
    def process_weights_after_loading(self, layer) -> None:
        reason = _ineligible_reason(self, layer)
        if reason is not None:
            if not _State.logged_skip:
                _State.logged_skip = True
                _log.warning("qwen36 moe_experts: %s keeps vLLM's fused MoE: %s", type(layer).__name__, reason)
            return original(self, layer)
        # `.data` is a new tensor object on the same storage: vLLM re-binding or replacing the parameter
        # leaves it pointing at the HF layout.
        w13, w2 = layer.w13_weight.data, layer.w2_weight.data
        original(self, layer)
        keep = not (_same_tensor(w13, layer.w13_weight) and _same_tensor(w2, layer.w2_weight))
        setattr(layer, _ATTR, _HFWeights(w13 if keep else None, w2 if keep else None))
        _State.layers += 1
        if _State.layers == 1:
            _log.info("qwen36 moe_experts: substituting routed experts (%s)",
                      "kept an HF-layout copy: this backend repacks the weights" if keep
                      else "reading vLLM's parameters, which keep the HF layout")

    return process_weights_after_loading


class _Runtime:
    config = None  # the MoEConfig the op dispatches with, set by install()
    op = None


def _routed_experts_op():
    """The dispatcher as one opaque torch op. vLLM's CPU backend traces the model with Dynamo once and
    reuses that graph for every token count; inside an op the dispatcher runs eagerly with the real T, so
    its per-T path choice and data-dependent grouping are not frozen into the graph."""
    if _Runtime.op is None:
        from model.dispatch.table import table_choice_for
        from model.moe import dispatch_experts

        @torch.library.custom_op("qwen36::moe_routed_experts", mutates_args=())
        def moe_routed_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                               topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
            config = _Runtime.config
            path = select_expert_path(x.shape[0], config, x.device, x.dtype)
            if path not in _State.logged_paths:  # one line per path and process: evidence of what ran
                _State.logged_paths.add(path)
                _log.info("qwen36 moe_experts: first call on path %r (T=%d, %s; dispatch table: %s)", path,
                          x.shape[0], x.dtype, table_choice_for(x.device).detail)
            return dispatch_experts(x, w13, w2, topk_weights.to(torch.float32), topk_ids.to(torch.int64), config)

        @moe_routed_experts.register_fake
        def _(x, w13, w2, topk_weights, topk_ids):
            return torch.empty_like(x)

        _Runtime.op = moe_routed_experts
    return _Runtime.op


def _wrap_apply(original):
    op = _routed_experts_op()
    order = __import__(ORDER_MODULE, fromlist=["SharedExpertsOrder"]).SharedExpertsOrder

    @functools.wraps(original)
    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        weights = getattr(layer, _ATTR, None)
        if weights is None:
            return original(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
        if shared_experts is not None:
            # The kernel would run it here only when it overlaps it; SharedExperts computes only then.
            shared_experts(shared_experts_input, order.MK_INTERNAL_OVERLAPPED)
        w13 = layer.w13_weight if weights.w13 is None else weights.w13
        w2 = layer.w2_weight if weights.w2 is None else weights.w2
        return op(x, w13, w2, topk_weights, topk_ids)

    return apply


PATCH = Patch(
    name="moe_experts",
    seam=f"{SEAM_CLASS} (unquantized_fused_moe, out-of-tree registry; else its apply/process_weights_after_loading)",
    required=True,
    switch=SWITCH,
    kind="compute",
    enabled=enabled,
    probe=probe,
    install=install,
    uninstall=uninstall,
)
