"""Pick the expert path for a batch of T tokens: the device's measured dispatch table, else a `MoEConfig`."""
from __future__ import annotations

import torch

from ..dispatch.scope import scoped
from ..dispatch.table import table_path_for
from .config import PREFILL_IMPLS, TINY_IMPLS, MoEConfig
from .experts import EXPERT_PATHS, run_expert_path

__all__ = ["select_expert_path", "dispatch_experts"]


@scoped
def select_expert_path(
    num_tokens: int,
    config: MoEConfig,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> str:
    """The registered path name that serves `num_tokens` tokens under `config`.

    MOE_NATIVE off -> `reference`. Given the device (and dtype) of the call, the device's dispatch table
    (model.dispatch.table) names the path where it has one that can run the input. Otherwise the knobs:
    T == 1 with MOE_DECODE_NATIVE -> `decode_fused`; T <= TINY_MAX -> the tiny implementation; otherwise
    the prefill implementation.
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens={num_tokens}: an MoE call needs at least one token")
    if not config.native:
        return EXPERT_PATHS.reference.name
    if device is not None and dtype is not None:
        measured = table_path_for(
            "moe_experts", num_tokens, device, dtype,
            lambda name: EXPERT_PATHS.can_run(name, num_tokens, dtype, device),
        )
        if measured is not None:
            return measured
    if num_tokens == 1 and config.decode_native:
        return "decode_fused"
    if num_tokens <= config.tiny_max:
        return TINY_IMPLS[config.tiny_impl]
    return PREFILL_IMPLS[config.prefill_impl]


def dispatch_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    config: MoEConfig,
) -> torch.Tensor:
    """Routed-expert output in x's dtype, computed by the configured path."""
    name = select_expert_path(x.shape[0], config, x.device, x.dtype)
    if not EXPERT_PATHS[name].supports(x.shape[0], x.dtype, x.device):
        raise ValueError(
            f"the configured MoE path {name!r} cannot run T={x.shape[0]} {x.dtype} on {x.device}; "
            "pick another with ENGINEX_MOE_PREFILL_IMPL / ENGINEX_MOE_TINY_IMPL"
        )
    return run_expert_path(name, x, w13, w2, weights, ids).to(x.dtype)
