"""The whole MoE block of Qwen3-Next / Qwen3.5 (router, routed experts, gated shared expert) served by the model's
block paths, through vLLM's out-of-tree registry.

Seam (vLLM 0.32): `MoERunner` (vllm/model_executor/layers/fused_moe/runner/moe_runner.py), a `PluggableLayer` that
`FusedMoEFactory` builds for every fused-MoE layer. `Qwen3NextSparseMoeBlock` hands it the router GEMM (`gate`) and
the shared expert (`shared_experts`: a `Qwen2MoeMLP` whose `expert_gate` is the sigmoid gate), and calls it as
`experts(hidden_states, router_logits=hidden_states)`: the runner computes the whole block, so it is the seam that
carries the shared expert. The substitute subclasses `MoERunner`; what it does not serve is vLLM's own forward
(with the routed-experts and router substitutions where they are on).

What it serves: a call of T <= model.moe.FUSED_BLOCK_MAX_TOKENS tokens (decode steps), block `moe_block` keyed by
T, by the device's table (patches/model_paths/served_choice.py): `triton_fused_block` (4 launches) or `composed`.
Larger T (prefill) is GEMM-bound, where vLLM's grouped kernels (or the routed-experts substitution) serve; the
launches a token pays are the decode step's.
Forced (`QWEN36_SERVED_BLOCKS_FORCE=1`, tests) the block serves the odd-numbered layers only, so one server step also
runs vLLM's runner with the routed-experts and router substitutions on the even ones: every adapter runs at every T.

The adapter:
- weights: the block's paths read the raw weights in the checkpoint's layout (model.moe.MoEWeights). vLLM
  transforms some after loading: its CPU linears pack theirs and drop the parameter (dispatch_cpu_unquantized_gemm,
  `remove_weight=True`), its MoE backends may repack the expert weights. So the substitute takes references to
  the parameters when it is built, where the block may serve on this device: loading copies into those parameters
  in place, and the reference keeps the loaded values whatever vLLM rebinds later. At the first call each reference
  is compared with vLLM's live parameter: where that still holds the same values (GPU linears, vLLM's Triton
  experts) the live one is read and the reference let go, so no second copy stays; where vLLM repacked or dropped
  it (CPUs), one plain copy stays, logged once.
- router: the gate's weight, softmax top-k renormalised (the router must be that: model.moe routes so);
  the routed weights w13 [E, 2I, H] (gate rows first) and w2 [E, H, I]; the shared expert's merged gate_up_proj
  split into gate and up rows, its down_proj and its expert_gate.
- tensor parallelism: each rank computes its shard's partial sum (routed and shared); vLLM's own
  `_maybe_reduce_final_output` all-reduces it, as it does its own unreduced output.
Layers it cannot serve (another router, expert or sequence parallelism, latent transforms, routed scaling, a fused
shared-expert gate, a missing shared expert) keep vLLM's forward; the first is logged with its reason.
"""
from __future__ import annotations

import functools
import importlib
import logging

import torch

from model.moe import MOE_BLOCK_PATHS, MoEWeights, select_block_path
from model.moe.block_paths import FUSED_BLOCK_MAX_TOKENS

from ..core import oot
from ..core.registry import Patch
from ..core.seams import signature_problem
from .moe_router import router_name_for, routing_problem
from . import served_ops
from .served_choice import BlockServing, configure, forced, serving_device, table_rows_detail

__all__ = ["PATCH", "SWITCH", "BLOCKS", "BLOCK", "block_by_table", "served_class", "block_problem", "uninstall"]

SWITCH = "QWEN36_PATCH_SERVED_MOE"
SEAM_MODULE = "vllm.model_executor.layers.fused_moe.runner.moe_runner"
SEAM_CLASS = "MoERunner"
FORWARD_PARAMS = ("self", "hidden_states", "router_logits", "input_ids", "shared_experts_input")
SERVABLE = ("composed", "triton_fused_block")  # the block paths this adapter runs (the reference is a test's)

BLOCKS = ("moe_block",)  # the dispatch-table blocks this patch serves

_log = logging.getLogger("vllm.qwen36.patches.served_blocks")  # under "vllm." to share vLLM's log handler


def _default(key: int, device: torch.device, dtype: torch.dtype) -> str:
    return select_block_path(key, device, dtype)


BLOCK = BlockServing("moe_block", MOE_BLOCK_PATHS, _default)


class _Runtime:
    config = None  # model.moe.MoEConfig (the knobs), set at install
    logged_skip = False
    logged_copies = False


def block_by_table(hidden_states: torch.Tensor, weights_for) -> torch.Tensor | None:
    """The block's output (this rank's partial sum) by the model path the table (or forcing) chooses for this call of
    T <= FUSED_BLOCK_MAX_TOKENS tokens, or None where vLLM's own serves it; `weights_for(x)`: the block's
    model.moe.MoEWeights, or None where they cannot serve x. No vLLM needed (the GPU tests call it)."""
    tokens = hidden_states.shape[0]
    name = BLOCK.path(tokens, tokens, hidden_states.device, hidden_states.dtype)
    weights = weights_for(hidden_states) if name in SERVABLE else None
    if weights is None:
        return None
    return MOE_BLOCK_PATHS[name].fn(hidden_states, weights, _Runtime.config,
                                    router_name_for(hidden_states.device, hidden_states.dtype))


def block_problem(runner) -> str | None:
    """None when the model's block computes what `runner` computes, else why not (vLLM's forward then serves)."""
    reason = routing_problem(runner.router)  # the model's architecture and vLLM's routing, as moe_router judges them
    if reason is not None:
        return reason
    if runner.gate is None or getattr(runner.gate, "bias", None) is not None:
        return "no bias-free router gate held by the runner"
    if runner.shared_expert_gate is not None:
        return "the shared-expert gate is fused into the router (fused shared experts)"
    shared = getattr(runner.shared_experts, "_layer", None)
    if shared is None or getattr(shared, "expert_gate", None) is None or not hasattr(shared, "gate_up_proj"):
        return "no gated shared expert (Qwen2MoeMLP with expert_gate) held by the runner"
    if runner.routed_input_transform is not None or runner.routed_output_transform is not None:
        return "latent routed transforms"
    if runner.routed_scaling_factor != 1.0:
        return f"routed_scaling_factor={runner.routed_scaling_factor}"
    moe = runner.moe_config
    if moe.is_sequence_parallel or moe.dp_size > 1 or moe.ep_size > 1 or getattr(moe, "pcp_size", 1) > 1:
        return "sequence, data, expert or context parallelism"
    if runner.routed_experts.expert_map is not None or moe.has_bias:
        return "an expert map or expert biases"
    activation = getattr(runner.routed_experts.activation, "value", None)
    if activation != "silu":
        return f"activation {activation!r}"
    return None


@functools.cache
def served_class() -> tuple[type, type]:
    """(vLLM's class, ours); built once, so a second install registers the same class."""
    in_tree = getattr(importlib.import_module(SEAM_MODULE), SEAM_CLASS)

    class ServedMoERunner(in_tree):
        """vLLM's MoE runner; a decode-sized call by the table's model block path."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            # Taken now, before loading: see the module docstring ("weights"). Only where the block may serve.
            self._qwen36_kept = None
            self._qwen36_block: MoEWeights | str | None = None
            if not torch.compiler.is_compiling():
                device, dtype = self._qwen36_device_dtype()
                if BLOCK.may_serve(device, dtype) and block_problem(self) is None:
                    self._qwen36_kept = tuple(getattr(module, name) for module, name in self._qwen36_sources())
                    served_ops.name_layer(self, BLOCK.block)
                served_ops.log_mode_once(BLOCK.block, lambda: served_ops.who_serves(BLOCK, device))

        def _qwen36_sources(self) -> tuple[tuple[torch.nn.Module, str], ...]:
            """Where vLLM holds each weight the block reads: (module, parameter name), in MoEWeights' order."""
            shared = self.shared_experts._layer
            return ((self.gate, "weight"), (self.routed_experts, "w13_weight"), (self.routed_experts, "w2_weight"),
                    (shared.gate_up_proj, "weight"), (shared.down_proj, "weight"), (shared.expert_gate, "weight"))

        def _qwen36_live_or_kept(self) -> tuple[torch.Tensor, ...]:
            """Each kept weight, or vLLM's live parameter where it still holds the same values: then the kept
            reference is let go, so a device where vLLM changed nothing holds no second copy."""
            out, copies = [], []
            for (module, name), kept in zip(self._qwen36_sources(), self._qwen36_kept):
                live = getattr(module, name, None)
                same = isinstance(live, torch.Tensor) and live.shape == kept.shape and live.dtype == kept.dtype and (
                    live.data_ptr() == kept.data_ptr() or torch.equal(live, kept))
                out.append(live if same else kept)
                if not same:
                    copies.append(name if module is self.routed_experts else f"{type(module).__name__}.{name}")
            if copies and not _Runtime.logged_copies:
                _Runtime.logged_copies = True
                _log.info("qwen36 served moe_block: kept plain copies of %s (vLLM packed or dropped them after "
                          "loading)", ", ".join(copies))
            return tuple(out)

        def _qwen36_device_dtype(self) -> tuple[torch.device, torch.dtype]:
            weight = self.routed_experts.w13_weight
            device = serving_device() if weight.device.type != "cpu" else weight.device
            return device, self.moe_config.in_dtype

        def forward(self, hidden_states, router_logits, input_ids=None, shared_experts_input=None):
            if not torch.compiler.is_compiling():
                return self._qwen36_eager(hidden_states, router_logits, input_ids, shared_experts_input)
            # Traced (a compiled server): one opaque op that chooses per call at run time (served_ops).
            if (input_ids is None and shared_experts_input is None and self._qwen36_kept is not None
                    and hidden_states.dim() == 2):
                return served_ops.served_moe_block(hidden_states, router_logits, self._qwen36_op_name)
            return super().forward(hidden_states, router_logits, input_ids, shared_experts_input)

        def _qwen36_eager(self, hidden_states, router_logits, input_ids=None, shared_experts_input=None):
            if (shared_experts_input is None and self._qwen36_kept is not None
                    and hidden_states.dim() == 2 and hidden_states.shape[0] <= FUSED_BLOCK_MAX_TOKENS
                    and not (forced() and self.layer_id % 2 == 0)):
                out = block_by_table(hidden_states, self._qwen36_weights)
                if out is not None:
                    return self._maybe_reduce_final_output(out, None, False)
            return super().forward(hidden_states, router_logits, input_ids, shared_experts_input)

        def _qwen36_weights(self, x: torch.Tensor) -> MoEWeights | None:
            """The block's weights (built at the first call, after loading), or None where they cannot serve x."""
            if self._qwen36_block is None:
                router, w13, w2, gate_up, down, expert_gate = self._qwen36_live_or_kept()
                self._qwen36_kept = ()  # held by the block's weights now, only where they are copies
                shared_size = down.shape[1]
                try:
                    self._qwen36_block = MoEWeights(
                        router=router, w13=w13, w2=w2, shared_w1=gate_up[:shared_size],
                        shared_w3=gate_up[shared_size:], shared_w2=down, shared_gate=expert_gate,
                        top_k=self.router.top_k)
                except ValueError as exc:
                    self._qwen36_block = f"weights: {exc}"
            block = self._qwen36_block
            if not isinstance(block, str) and block.w13.dtype == x.dtype == block.router.dtype:
                return block
            if not _Runtime.logged_skip:
                _Runtime.logged_skip = True
                _log.warning("qwen36 served moe_block: %s keeps vLLM's own: %s", self.layer_name,
                             block if isinstance(block, str) else f"weights {block.w13.dtype}/{block.router.dtype}"
                             f" for {x.dtype} input")
            return None

    return in_tree, ServedMoERunner


def probe() -> str | None:
    reason = oot.registry_reason(SEAM_MODULE, SEAM_CLASS)
    if reason is not None:
        return reason
    cls = getattr(importlib.import_module(SEAM_MODULE), SEAM_CLASS)
    missing = [name for name in ("_maybe_reduce_final_output", "shared_experts", "layer_id")
               if not hasattr(cls, name)]
    if missing:
        return f"{SEAM_CLASS} lacks {missing} (the adapter uses vLLM's final all-reduce and the layer's index)"
    return signature_problem(f"{SEAM_CLASS}.forward", cls.forward, FORWARD_PARAMS)


def install(settings) -> str:
    configure(settings.served_force)
    _Runtime.config = settings.moe
    oot.register(*served_class())
    device = serving_device()
    return (f"registry: {SEAM_CLASS} (router, routed experts and gated shared expert), T<={FUSED_BLOCK_MAX_TOKENS} "
            f"(moe_block: {table_rows_detail('moe_block', device)}) on {device}; larger T vLLM's"
            + ("; forced: the model's path on odd layers where the table leaves vLLM's" if settings.served_force
               else "") + f"; {served_ops.routes(BLOCK.block)}")


def uninstall() -> None:
    oot.unregister(*served_class())


PATCH = Patch(
    name="served_moe",
    seam=f"{SEAM_MODULE}.{SEAM_CLASS} (out-of-tree registry)",
    required=False,  # without it vLLM's runner serves (with the routed-experts substitution): right
    switch=SWITCH,
    kind="compute",
    probe=probe,
    install=install,
    uninstall=uninstall,
)
