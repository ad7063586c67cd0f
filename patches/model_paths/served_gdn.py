"""The GDN layer's decode steps served by the model's decode-layer paths over vLLM's own state, through vLLM's
out-of-tree registry.

Seam (vLLM 0.32): `QwenGatedDeltaNetAttention` (a `PluggableLayer`, `qwen_gated_delta_net_attention`,
vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py), the linear-attention layer of Qwen3-Next and
Qwen3.5. The substitute subclasses it, so weights, loading, the state cache vLLM allocates for it and every batch
the model's path does not serve stay vLLM's.

What it serves: a decode-only step (vLLM's GDN metadata for this layer says no prefill, no speculative tokens,
one token per request), block `gdn_layer_decode`, keyed by the batch (model.gdn.GDN_DECODE_LAYER_PATHS):
- `staged`: the model's blocks one after another (conv, gating, delta rule, gated norm; each its own serving
  choice), torch ops: what runs on a CPU;
- `triton`: the fused Triton kernel for conv, gating, rule and gated norm (model.gdn.triton_decode_layer), which
  reads and advances this step's requests' rows of vLLM's caches in place (its `rows` argument). It keeps the
  recurrent state in float32: with another recurrent cache dtype vLLM's own serves, logged once.
Prefill and mixed prefill + decode steps run vLLM's own layer: vLLM's chunked kernels (FLA's on GPUs, its C++ ones
on CPUs) write the state a decode step then reads, and a prefill runs once per request where the decode step runs
once per output token, so the launch count a token pays is the decode step's.

The adapter, which the on/off server test checks (a wrong state index or a transposed state gives other tokens):
- vLLM's projections and its own layout code (`prepare_gdn_attention_core_inputs`: the Qwen3-Next interleaved or
  the Qwen3.5 flat layout) give q, k, v, z, b, a; vLLM's `out_proj` (its tensor-parallel all-reduce included)
  takes the normed output. Only the middle is the model's.
- state: the rows `non_spec_state_indices_tensor[:B]` of vLLM's caches, advanced one token (`staged` gathers them
  and writes them back; `triton` indexes them in place).
  The conv cache is [slots, dim, W-1] or, in vLLM's other orientation, [slots, W-1, dim] (`is_conv_state_dim_first`).
  The recurrent cache is declared [slots, HV, V, K] and its memory read differently per platform: FLA's Triton
  kernels (GPUs) index it as [V, K], vLLM's CPU kernels view it as [K, V] (`ssm_state.view(..., k_dim, v_dim)` in
  vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py). `recurrent_as_kv` gives the model's [K, V] view of
  either.
- the conv weight: vLLM's CPU backend packs it in place for its C++ kernel where the CPU has AVX-512 BF16 and
  keeps the plain [dim, W] copy as `conv1d._cpu_unpacked_conv_weight`; elsewhere `conv1d.weight` is [dim, 1, W].
"""
from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass

import torch

from model.gdn import GDN_DECODE_LAYER_PATHS, GDNDims, GDNState, select_decode_layer_path
from model.gdn.decode_layer import triton_decode_layer
from model.gdn.staged import staged_core

from ..core import oot
from ..core.registry import Patch
from ..core.seams import signature_problem
from . import served_ops
from .served_choice import BlockServing, configure, serving_device, table_rows_detail

__all__ = ["PATCH", "SWITCH", "BLOCKS", "DECODE", "SERVABLE", "fused_core", "recurrent_as_kv", "served_class",
           "uninstall"]

SWITCH = "QWEN36_PATCH_SERVED_GDN"
SEAM_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
SEAM_CLASS = "QwenGatedDeltaNetAttention"
LAYOUT_MODULE = "vllm.model_executor.layers.mamba.mamba_utils"
PREPARE_PARAMS = ("self", "mixed_qkvz", "mixed_ba", "num_tokens")
METADATA_MODULE = "vllm.v1.attention.backends.gdn_attn"
# What the adapter reads of this step's GDN metadata (_decode_only, _served_decode).
METADATA_FIELDS = ("num_prefills", "num_decodes", "num_decode_tokens", "num_actual_tokens", "spec_sequence_masks",
                   "num_accepted_tokens", "non_spec_state_indices_tensor")
SERVABLE = ("staged", "triton")  # the decode-layer paths this adapter runs (the reference is a test's)

BLOCKS = ("gdn_layer_decode",)  # the dispatch-table blocks this patch serves

_log = logging.getLogger("vllm.qwen36.patches.served_blocks")  # under "vllm." to share vLLM's log handler

DECODE = BlockServing("gdn_layer_decode", GDN_DECODE_LAYER_PATHS, select_decode_layer_path)


def recurrent_as_kv(ssm: torch.Tensor) -> torch.Tensor:
    """vLLM's recurrent cache [slots, HV, V, K] as the model's [slots, HV, K, V], a view of the same memory, read
    as the platform's vLLM kernels read it (module docstring)."""
    if ssm.device.type == "cpu":
        slots, heads, v_dim, k_dim = ssm.shape
        return ssm.view(slots, heads, k_dim, v_dim)
    return ssm.transpose(-1, -2)


@dataclass(eq=False)
class _CoreWeights:
    """What the fused kernel reads of model.gdn.GDNWeights (everything but the projections, which stay vLLM's)."""

    conv1d: torch.Tensor  # [conv_dim, W]
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    norm: torch.Tensor
    dims: GDNDims


def fused_core(mixed_qkv, z, b, a, weights, conv_cache, recurrent_cache, rows) -> torch.Tensor:
    """The fused kernel over [q | k | v | z | b | a] rows, advancing rows `rows` of the caches (conv [slots, dim,
    W-1], recurrent [slots, HV, K, V] float32) in place: no gather, no scatter. The served `triton` path; no vLLM
    needed (the GPU tests call it)."""
    batch = mixed_qkv.shape[0]
    proj = torch.cat([mixed_qkv, z.reshape(batch, -1), b, a], dim=-1)
    cache = GDNState(conv=conv_cache, recurrent=recurrent_cache)
    return triton_decode_layer.fused_decode_core(proj, weights, cache, cache, rows)


def _decode_only(layer):
    """This step's GDN metadata for `layer` when the step is decode-only (one token per request, no speculative
    tokens), else None."""
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    meta = metadata.get(layer.prefix) if isinstance(metadata, dict) else None
    if meta is None or meta.num_prefills != 0 or meta.num_decodes <= 0:
        return None
    if meta.spec_sequence_masks is not None or meta.num_accepted_tokens is not None:
        return None
    if meta.num_decode_tokens != meta.num_decodes or meta.num_actual_tokens != meta.num_decodes:
        return None
    return meta


def _refuse_triton(state_dtype: torch.dtype) -> None:
    """None (vLLM's own): the fused kernel keeps the recurrent state in float32, and this server's cache is not
    (`--mamba-ssm-cache-dtype float32` gives it one). Logged once."""
    if not _Refused.logged:
        _Refused.logged = True
        _log.warning("qwen36 served gdn_layer_decode: the table's `triton` needs a float32 recurrent state cache, "
                     "this server's is %s: vLLM's own serves (start vLLM with --mamba-ssm-cache-dtype float32)",
                     state_dtype)
    return None


class _Refused:
    logged = False


@functools.cache
def served_class() -> tuple[type, type]:
    """(vLLM's class, ours); built once, so a second install registers the same class."""
    module = importlib.import_module(SEAM_MODULE)
    in_tree = getattr(module, SEAM_CLASS)
    is_conv_state_dim_first = importlib.import_module(LAYOUT_MODULE).is_conv_state_dim_first

    class ServedQwenGatedDeltaNet(in_tree):
        """vLLM's GDN layer; a decode-only step by the table's model path over vLLM's own state."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            served_ops.name_layer(self, DECODE.block)
            mode = served_ops.log_mode_once(DECODE.block, lambda: served_ops.who_serves(DECODE, serving_device()))
            # A mode that would freeze the op's choice into a graph (served_ops.mode_problem) keeps vLLM's own.
            self._qwen36_traced_op = mode is None or served_ops.mode_problem(DECODE.block, mode) is None

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            if not torch.compiler.is_compiling():
                return self._qwen36_eager(hidden_states)
            # Traced (a compiled server): one opaque op that reads this step's metadata and chooses at run time
            # (served_ops); nothing of the layer's state is read while tracing (vLLM binds the caches later).
            if self._qwen36_traced_op and served_ops.serves_here(DECODE, hidden_states.device, hidden_states.dtype):
                return served_ops.served_gdn_layer(hidden_states, self._qwen36_op_name)
            return super().forward(hidden_states)

        def _qwen36_eager(self, hidden_states: torch.Tensor) -> torch.Tensor:
            if not DECODE.may_serve(hidden_states.device, hidden_states.dtype):
                return super().forward(hidden_states)
            meta = _decode_only(self)
            name = self._decode_path(meta, hidden_states) if meta is not None else None
            if name is not None:
                return self._served_decode(hidden_states, meta, name)
            return super().forward(hidden_states)

        def _decode_path(self, meta, hidden_states: torch.Tensor) -> str | None:
            """The model path that serves this decode-only step, or None where vLLM's own does: the table's choice
            for the batch, unless this layer cannot run it (the fused kernel wants a float32 recurrent state; an
            AVX2-only CPU's vLLM keeps it in bf16). One place, so the launch counter serves as the server does."""
            if not self._model_computes_this():
                return None
            name = DECODE.path(meta.num_decodes, 1, hidden_states.device, hidden_states.dtype)
            if name == "triton" and self.kv_cache[1].dtype != torch.float32:
                name = _refuse_triton(self.kv_cache[1].dtype)
            return name if name in SERVABLE else None

        def _model_computes_this(self) -> bool:
            width = self._conv_weight().shape[-1]
            kv_cache = getattr(self, "kv_cache", None)
            if not kv_cache:
                return False
            conv_cache = kv_cache[0]
            state_len = conv_cache.shape[-1] if is_conv_state_dim_first() else conv_cache.shape[-2]
            return (self.activation == "silu" and self.norm.activation in ("silu", "swish")
                    and self.conv1d.bias is None and state_len == width - 1)

        # --- the adapter ---------------------------------------------------------------------------------------

        def _dims(self) -> GDNDims:
            tp = self.tp_size
            return GDNDims(hidden_size=self.hidden_size, num_k_heads=self.num_k_heads // tp,
                           num_v_heads=self.num_v_heads // tp, head_k_dim=self.head_k_dim,
                           head_v_dim=self.head_v_dim, conv_kernel=self.conv_kernel_size, eps=self.norm.eps)

        def _conv_weight(self) -> torch.Tensor:
            unpacked = getattr(self.conv1d, "_cpu_unpacked_conv_weight", None)
            weight = self.conv1d.weight
            return unpacked if unpacked is not None else weight.view(weight.size(0), weight.size(-1))

        def _core_weights(self) -> _CoreWeights:
            cached = self.__dict__.get("_qwen36_core_weights")
            if cached is None:
                cached = _CoreWeights(self._conv_weight(), self.A_log, self.dt_bias, self.norm.weight, self._dims())
                self.__dict__["_qwen36_core_weights"] = cached
            return cached

        def _state_views(self) -> tuple[torch.Tensor, torch.Tensor]:
            """(conv cache [slots, dim, W-1], recurrent cache [slots, HV, K, V]): views of vLLM's caches."""
            conv, ssm = self.kv_cache[0], self.kv_cache[1]
            return (conv if is_conv_state_dim_first() else conv.transpose(-1, -2)), recurrent_as_kv(ssm)

        def _served_decode(self, hidden_states: torch.Tensor, meta, name: str) -> torch.Tensor:
            tokens = hidden_states.shape[0]
            batch = meta.num_decodes
            mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
            ba, _ = self.in_proj_ba(hidden_states)
            mixed_qkv, z, b, a = self.prepare_gdn_attention_core_inputs(mixed_qkvz, ba, tokens)
            mixed_qkv, z, b, a = mixed_qkv[:batch], z[:batch], b[:batch], a[:batch]
            rows = meta.non_spec_state_indices_tensor[:batch]
            core = self._core_triton if name == "triton" else self._core_staged
            normed = core(mixed_qkv, z, b, a, *self._state_views(), rows)
            if tokens != batch:  # padded rows (a captured batch size): zeros, as vLLM's core leaves them
                normed = torch.cat([normed, normed.new_zeros(tokens - batch, normed.shape[-1])])
            output, _ = self.out_proj(normed)
            return output

        def _core_staged(self, mixed_qkv, z, b, a, conv_cache, recurrent_cache, rows) -> torch.Tensor:
            """The model's blocks one after another (model.gdn.staged.staged_core) on the gathered rows `rows` of the
            caches, written back after the step."""
            batch = mixed_qkv.shape[0]
            rows = rows.to(torch.long)
            normed, conv_state, recurrent = staged_core(
                mixed_qkv.unsqueeze(1), z.unsqueeze(1), b.unsqueeze(1), a.unsqueeze(1), self._core_weights(),
                conv_cache.index_select(0, rows), recurrent_cache.index_select(0, rows).float(),
                rule=None, conv=None, norm=None)
            conv_cache.index_copy_(0, rows, conv_state.to(conv_cache.dtype))
            recurrent_cache.index_copy_(0, rows, recurrent.to(recurrent_cache.dtype))
            return normed.reshape(batch, -1)

        def _core_triton(self, mixed_qkv, z, b, a, conv_cache, recurrent_cache, rows) -> torch.Tensor:
            return fused_core(mixed_qkv, z, b, a, self._core_weights(), conv_cache, recurrent_cache, rows)

    return in_tree, ServedQwenGatedDeltaNet


def probe() -> str | None:
    reason = oot.registry_reason(SEAM_MODULE, SEAM_CLASS)
    if reason is not None:
        return reason
    cls = getattr(importlib.import_module(SEAM_MODULE), SEAM_CLASS)
    # The adapter takes q, k, v, z, b, a from vLLM's own layout code.
    reason = signature_problem(f"{SEAM_CLASS}.prepare_gdn_attention_core_inputs",
                               getattr(cls, "prepare_gdn_attention_core_inputs", None), PREPARE_PARAMS)
    if reason is not None:
        return reason
    try:
        importlib.import_module(LAYOUT_MODULE).is_conv_state_dim_first  # noqa: B018
        importlib.import_module("vllm.forward_context").get_forward_context  # noqa: B018
        metadata = importlib.import_module(METADATA_MODULE).GDNAttentionMetadata
    except (ImportError, AttributeError) as exc:
        return f"vLLM's state layout, forward context or GDN metadata is not where 0.32 has it ({exc})"
    fields = set(getattr(metadata, "__dataclass_fields__", ()))
    missing = [f for f in METADATA_FIELDS if f not in fields]
    if missing:
        return f"{METADATA_MODULE}.GDNAttentionMetadata lacks {missing} (the adapter reads them each decode step)"
    return None


def install(settings) -> str:
    configure(settings.served_force)
    oot.register(*served_class())
    device = serving_device()
    triton_note = "" if triton_decode_layer is not None else "; no Triton here: `triton` rows leave vLLM's"
    splitting = served_ops.register_splitting_op()
    return (f"registry: {SEAM_CLASS}, decode-only steps (gdn_layer_decode: {table_rows_detail('gdn_layer_decode', device)})"
            f" on {device}; prefill and mixed steps vLLM's" + triton_note
            + f"; {served_ops.routes(DECODE.block)}; {splitting}"
            + ("; forced: the model's path where the table leaves vLLM's" if settings.served_force else ""))


def uninstall() -> None:
    oot.unregister(*served_class())


PATCH = Patch(
    name="served_gdn",
    seam=f"{SEAM_MODULE}.{SEAM_CLASS} (out-of-tree registry)",
    required=False,  # without it vLLM's GDN layer serves: right, and as fast as vLLM makes it
    switch=SWITCH,
    kind="compute",
    probe=probe,
    install=install,
    uninstall=uninstall,
)
