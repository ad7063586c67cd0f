"""vLLM's own layers built in this process, without a server: for tests that hold the plugin's substitutes to vLLM's
layers, and for `qwen36 tune`, which times vLLM's own layer as one more candidate wherever vLLM imports.

vLLM builds a layer under a current `VllmConfig` (its compilation config decides which forward a `CustomOp` runs) and,
for layers with tensor-parallel weights, inside its process groups: `process_groups()` makes one of a single process
(gloo), as a server with `--tensor-parallel-size 1` has. Weights are copied into the parameters vLLM created and then
processed as vLLM's loader does (`process_weights_after_loading`: on a CPU it packs the linears' weights and the
experts'), so the layer computes exactly as served.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import tempfile
from pathlib import Path
from typing import Iterator, Mapping

import torch

__all__ = ["unavailable_reason", "eager_config", "process_groups", "moe_block_shapes", "build_moe_block", "build_norm"]


def unavailable_reason() -> str | None:
    """None where vLLM imports here, else why its layers cannot be built."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this environment"
    try:
        import vllm.model_executor.layers.layernorm  # noqa: F401
        import vllm.model_executor.models.qwen3_next  # noqa: F401
    except Exception as exc:  # another vLLM build (the platform's CoreX one) may lay its modules out otherwise
        return f"vLLM's Qwen3-Next layers do not import ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
    return None


def eager_config(hf_config: Mapping, dtype: torch.dtype, directory: Path | None = None):
    """A VllmConfig for the model `hf_config` describes (config only: no weights, no tokenizer), eager as the
    platform serves. The config.json goes into `directory` (a temporary one when None)."""
    from vllm.config import ModelConfig, VllmConfig

    directory = Path(tempfile.mkdtemp(prefix="qwen36-vllm-config-")) if directory is None else Path(directory)
    (directory / "config.json").write_text(json.dumps(dict(hf_config)))
    dtype_name = str(dtype).removeprefix("torch.")
    cfg = VllmConfig(model_config=ModelConfig(model=str(directory), skip_tokenizer_init=True, dtype=dtype_name,
                                              enforce_eager=True))
    # Which kernel each of vLLM's IR ops (rms_norm, fused_add_rms_norm, ...) runs: a worker sets this process-wide
    # at start (vllm/v1/worker/worker_base.py); without it the ops take their native torch implementation.
    priorities = getattr(getattr(cfg, "kernel_config", None), "ir_op_priority", None)  # absent before vLLM's IR ops
    if priorities is not None:
        priorities.set_default()
    return cfg


@contextlib.contextmanager
def process_groups(cfg) -> Iterator[None]:
    """vLLM's process groups of one process (gloo), set up for the duration unless they already are."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state

    started = []
    with set_current_vllm_config(cfg):
        if not torch.distributed.is_initialized():
            parallel_state.init_distributed_environment(1, 0, f"file://{tempfile.mktemp()}", 0, "gloo")
            started.append("distributed")
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(1, 1, backend="gloo")
            started.append("model parallel")
    try:
        yield
    finally:
        if "model parallel" in started:
            parallel_state.destroy_model_parallel()
        if "distributed" in started:
            parallel_state.destroy_distributed_environment()


def _load(cfg, module: torch.nn.Module, weights: Mapping[str, torch.Tensor], device: torch.device) -> None:
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    params = dict(module.named_parameters())
    missing = sorted(set(params) - set(weights))
    if missing:
        raise KeyError(f"no weight given for vLLM's parameters {missing}")
    for name, p in params.items():
        p.data.copy_(weights[name])
    process_weights_after_loading(module, cfg.model_config, device)


def moe_block_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """The parameters of vLLM's `Qwen3NextSparseMoeBlock` under `cfg` (tensor parallelism 1), by the names
    `build_moe_block` loads: gate rows then up rows in the merged `gate_up_proj` and in `w13` [E, 2I, H]."""
    c = cfg.model_config.hf_text_config
    h, e, i, s = c.hidden_size, c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
    return {"gate.weight": (e, h), "shared_expert_gate.weight": (1, h), "shared_expert.gate_up_proj.weight": (2 * s, h),
            "shared_expert.down_proj.weight": (h, s), "experts.routed_experts.w13_weight": (e, 2 * i, h),
            "experts.routed_experts.w2_weight": (e, h, i)}


def build_moe_block(cfg, prefix: str, weights: Mapping[str, torch.Tensor], device: torch.device):
    """vLLM's `Qwen3NextSparseMoeBlock` under `cfg` (process groups set up), named `prefix` (unique per config:
    vLLM looks MoE layers up by name), its parameters (`gate.weight`, `shared_expert_gate.weight`,
    `shared_expert.gate_up_proj.weight`, `shared_expert.down_proj.weight`, `experts.routed_experts.w13_weight`,
    `experts.routed_experts.w2_weight`) loaded from `weights` and processed."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.qwen3_next import Qwen3NextSparseMoeBlock

    with set_current_vllm_config(cfg), _default_dtype(cfg.model_config.dtype), torch.device(device):
        block = Qwen3NextSparseMoeBlock(cfg, prefix=prefix)
        _load(cfg, block, weights, device)
    return block


def build_norm(cfg, kind: str, weight: torch.Tensor, eps: float, **kwargs):
    """vLLM's `GemmaRMSNorm` (kind "gemma") or `RMSNormGated` (kind "gated", kwargs as vLLM's) with `weight`."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNormGated

    with set_current_vllm_config(cfg), torch.device(weight.device):
        if kind == "gemma":
            layer = GemmaRMSNorm(weight.shape[-1], eps=eps)
        elif kind == "gated":
            layer = RMSNormGated(weight.shape[-1], eps=eps, dtype=weight.dtype, **kwargs)
        else:
            raise ValueError(f"norm kind {kind!r}: 'gemma' or 'gated'")
        layer.weight.data = layer.weight.data.to(weight.dtype)
        layer.weight.data.copy_(weight)
    return layer


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)
