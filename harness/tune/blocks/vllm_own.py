"""vLLM's own layer as one more candidate of the blocks the plugin serves (rows named `vllm`), wherever vLLM imports.

The served blocks (patches/model_paths/served_choice.py) serve a model path only where the device's table names one;
a row naming `vllm` leaves vLLM's own layer. So the table must have timed vLLM's layer beside the model's paths: on
the BI-V100 box that is CoreX's vLLM against ours, side by side; on a CPU, vLLM's C++ kernels against ours.

Each candidate is vLLM's layer built in this process (harness/serving/vllm_inprocess.py: eager, tensor parallelism 1
at the per-rank dims, weights processed as vLLM's loader does), called as vLLM's model calls it, checked against the
same float64 reference and bound as the model's paths:
- `add_rms_norm`: `GemmaRMSNorm(y, residual=h)`, which returns (normed, h + y);
- `gdn_gated_norm`: `RMSNormGated(x, z)` over rows of the head dim (gate after the norm, SiLU), as vLLM's GDN layer
  calls it;
- `moe_block`: `Qwen3NextSparseMoeBlock` (router GEMM, vLLM's routing and fused experts, gated shared expert).
  vLLM routes in the logits' dtype, so at a near-tie it may pick another expert than the model's router: its
  reference is the float64 block routed by vLLM's own decision, as each model path's is routed by its own logits.
Not a candidate: the GDN decode layer (`gdn_layer_decode`). vLLM's layer reads its state cache and per-step
metadata from a running engine's forward context; building that outside vLLM's engine would time our imitation of
it. Its comparison is `qwen36 ab` on the box, served on against off.

Where vLLM does not import, or its layer cannot be built (another vLLM's layout), the run's notes say why and no
`vllm` row is written.
"""
from __future__ import annotations

import itertools
from typing import Callable

import torch

from harness.serving import vllm_inprocess
from harness.serving.tiny_model import TinyRecipe

from ..measure.dims import MoEDims
from ..measure.point import Measurement, Settings, kept_outputs, measure

__all__ = ["VLLM", "unavailable_reason", "wanted", "row", "add_rms_norm", "gated_norm", "moe_block"]

VLLM = "vllm"  # the table's name for vLLM's own layer (patches/model_paths/served_choice.py: VLLM_OWN)


class _Session:
    configs: dict = {}
    groups = None
    names = itertools.count()
    blocks: dict = {}


def unavailable_reason() -> str | None:
    return vllm_inprocess.unavailable_reason()


def wanted(only) -> bool:
    """Whether a point times vLLM's own: vLLM imports here, and the point's filter (None: every candidate) names it."""
    return (only is None or VLLM in only) and unavailable_reason() is None


def row(rows: list[Measurement], block: str, key: int, what: str, build: Callable[[], Callable[[], object]],
        check: Callable[[list], float], s: Settings, floor, bound: float | None, extra: dict) -> None:
    """Append vLLM's own layer's row at one point: `build()` gives the call (a failure to build is the row's detail,
    never an exception); each call's outputs are kept (harness/tune/measure/point.py's kept_outputs) and `check(kept)`
    gives the error against the point's reference."""
    m = Measurement(block, key, VLLM, "error", floor=floor, bound=bound, extra=dict(extra))
    rows.append(m)
    try:
        call = build()
    except Exception as exc:
        m.detail = f"vLLM's {what} could not be built: {type(exc).__name__}: {str(exc)[:200]}"
        return
    run, reset, kept = kept_outputs(call)
    measure(m, run, reset, lambda: (check(kept), ""), s)


def _config(hidden: int, dtype: torch.dtype, moe: MoEDims | None = None):
    """One VllmConfig per (dims, dtype), with vLLM's process groups up for the rest of the run (tune is one process
    that ends with the run)."""
    key = (hidden, dtype, moe)
    if key not in _Session.configs:
        overrides = {"hidden_size": hidden}
        if moe is not None:
            overrides.update(num_experts=moe.experts, num_experts_per_tok=moe.top_k,
                             moe_intermediate_size=moe.intermediate,
                             shared_expert_intermediate_size=moe.shared_intermediate)
        hf = TinyRecipe.load(**overrides).hf_config(eos_id=1, pad_id=0)
        cfg = vllm_inprocess.eager_config(hf, dtype)
        if _Session.groups is None:
            _Session.groups = vllm_inprocess.process_groups(cfg)
            _Session.groups.__enter__()
        _Session.configs[key] = cfg
    return _Session.configs[key]


def _vllms_own(layer: torch.nn.Module, what: str) -> torch.nn.Module:
    """`layer`, refused when this process's out-of-tree registry made it the plugin's substitute: the candidate is
    vLLM's own layer, never ours under its name."""
    if not type(layer).__module__.startswith("vllm."):
        raise RuntimeError(f"vLLM built {type(layer).__module__}.{type(layer).__qualname__} for its {what}: the "
                           "plugin's substitutes are registered in this process, so vLLM's own cannot be timed")
    return layer


def _in_forward_context(cfg, fn: Callable) -> Callable:
    """`fn` called inside a forward context of `cfg`, which vLLM's MoE runner reads (it finds its layer by name
    there). A server enters one per step; here each call enters its own, about 8 us on a Zen 4 core, which the
    `vllm` row's time includes (harness/serving/vllm_inprocess.py's module docstring)."""
    from vllm.forward_context import set_forward_context

    def call(*args):
        with set_forward_context(None, cfg):
            return fn(*args)

    return call


def add_rms_norm(hidden: int, eps: float, weight: torch.Tensor) -> Callable:
    """(h, y) -> (h + y, normed), as the model's add_rms_norm paths return, by vLLM's GemmaRMSNorm."""
    cfg = _config(hidden, weight.dtype)
    layer = _vllms_own(vllm_inprocess.build_norm(cfg, "gemma", weight, eps), "GemmaRMSNorm")

    def fn(h: torch.Tensor, y: torch.Tensor):
        normed, h_new = layer(y, h)
        return h_new, normed

    return fn  # vLLM's norms read no config or forward context when called


def gated_norm(eps: float, weight: torch.Tensor, hidden: int) -> Callable:
    """(x, z) [..., V] -> w * rms_norm(x) * silu(z) by vLLM's RMSNormGated, on rows of V as its GDN layer calls it."""
    cfg = _config(hidden, weight.dtype)
    layer = _vllms_own(vllm_inprocess.build_norm(cfg, "gated", weight, eps, norm_before_gate=True,
                                                 activation="silu"), "RMSNormGated")

    def fn(x: torch.Tensor, z: torch.Tensor):
        v = x.shape[-1]
        return layer(x.reshape(-1, v), z.reshape(-1, v)).reshape(x.shape)

    return fn


def moe_block(d: MoEDims, w, device: torch.device) -> tuple[Callable, Callable]:
    """(x [T, H] -> the block by vLLM's Qwen3NextSparseMoeBlock with the weights of model.moe.MoEWeights `w`,
    x -> vLLM's routing of x), built once per weights (vLLM's processing repacks them)."""
    key = (d, id(w), device)
    if key not in _Session.blocks:
        _Session.blocks[key] = (w, _build_moe_block(d, w, device))  # w held: its id stays this one's
    return _Session.blocks[key][1]


def _build_moe_block(d: MoEDims, w, device: torch.device) -> tuple[Callable, Callable]:
    cfg = _config(d.hidden, w.w13.dtype, d)
    weights = {
        "gate.weight": w.router, "shared_expert_gate.weight": w.shared_gate,
        "shared_expert.gate_up_proj.weight": torch.cat([w.shared_w1, w.shared_w3]),
        "shared_expert.down_proj.weight": w.shared_w2,
        "experts.routed_experts.w13_weight": w.w13, "experts.routed_experts.w2_weight": w.w2,
    }
    block = vllm_inprocess.build_moe_block(cfg, f"model.layers.0.mlp_tune{next(_Session.names)}", weights, device)
    runner = _vllms_own(block.experts, "MoE runner")

    def routing(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's own decision for x (its gate's logits, its router): float32 weights, int64 ids."""
        logits, _ = runner.gate(x)
        weights, ids = runner.router.select_experts(x, logits)
        return weights.float(), ids.long()

    return _in_forward_context(cfg, lambda x: block(x)), _in_forward_context(cfg, routing)
