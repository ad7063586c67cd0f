"""The MoE block's paths (`MOE_BLOCK_PATHS`) and `moe_block`, which runs the one the device's dispatch table
picks (block "moe_block", keyed by tokens), else `composed`.

Every path is called as `fn(x [T, H], w: MoEWeights, config: MoEConfig, router: str | callable) -> [T, H]` in
x's dtype (the reference: float64).
- `reference`: the float64 definition (model.moe.block.moe_block_reference), routed from float64 logits.
- `composed`: the block as separate ops: router GEMM, the `router` variant, the expert path model.moe.dispatch
  picks under `config` (its own table block "moe_experts", else the knobs), the shared expert. What every CPU
  runs, and what `moe_block` always ran before this table existed.
- `triton_fused_block`: the block in four launches (model.moe.triton_block), for small T. It has its own fused
  router, so it ignores `router` (its routing is `triton_fused`'s, the same decisions as `topk_softmax`'s) and
  `config` (no expert path to pick).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..dispatch import triton_support
from ..dispatch.paths import LOW_PRECISION, ComputePath, PathTable, always_float64
from ..dispatch.scope import scoped
from ..dispatch.table import table_path_for
from .block import MoEWeights, moe_block_reference, shared_expert
from .config import MoEConfig
from .dispatch import dispatch_experts
from .router import ROUTERS

try:
    import triton  # noqa: F401  (only whether it imports)
except ImportError:  # a torch build or platform without Triton
    triton = None

if triton is not None:
    from . import triton_block, triton_decode

__all__ = ["FUSED_BLOCK_MAX_TOKENS", "MOE_BLOCK_PATHS", "moe_block", "select_block_path"]

Router = str | Callable

# The fused block reads each (token, slot) pair's expert weights on its own (model.moe.triton_decode), which is
# what decode wants and what loses to grouped GEMMs as T grows; 64 is the largest T its block sizes were tuned
# at (DECODE_CONFIGS) and the largest its tests cover, so a table can never send it more.
FUSED_BLOCK_MAX_TOKENS = 64


def _reference(x: torch.Tensor, w: MoEWeights, config: MoEConfig, router: Router) -> torch.Tensor:
    return moe_block_reference(x, w)  # the definition routes from float64 logits: `router` is not its business


def _composed(x: torch.Tensor, w: MoEWeights, config: MoEConfig, router: Router) -> torch.Tensor:
    route = ROUTERS[router] if isinstance(router, str) else router
    weights, ids = route(F.linear(x, w.router), w.top_k)
    routed = dispatch_experts(x, w.w13, w.w2, weights, ids, config)
    return routed + shared_expert(x, w)


def _triton_fused_block(x: torch.Tensor, w: MoEWeights, config: MoEConfig, router: Router) -> torch.Tensor:
    if triton is None:
        raise ValueError("the 'triton_fused_block' MoE block needs Triton, which is not installed; use 'composed'")
    return triton_block.moe_block_triton_fused(x, w)


def _triton_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    # The router's and the experts' kernels are defined in one process, so both were interpreted or neither.
    return triton_support.unavailable_reason(device, None if triton is None else triton_decode.INTERPRETED)


MOE_BLOCK_PATHS = PathTable("MoE block path", [
    ComputePath("reference", _reference, "float64: routing from float64 logits, every expert a loop",
                is_reference=True, output_dtype_rule=always_float64),
    ComputePath("composed", _composed, "router GEMM + router variant + dispatched expert path + shared expert"),
    ComputePath("triton_fused_block", _triton_fused_block,
                "4 launches: router GEMM, fused router, gate-up for k + 1 slots (shared expert in slot k), "
                "down + weighted sum with the sigmoid-gated shared expert",
                max_tokens=FUSED_BLOCK_MAX_TOKENS, dtypes=LOW_PRECISION, why_unavailable=_triton_unavailable),
])


@scoped
def select_block_path(
    num_tokens: int,
    device: torch.device | str,
    dtype: torch.dtype,
    config: MoEConfig | None = None,
) -> str:
    """The block path for `num_tokens` tokens: the device's dispatch table entry (block "moe_block") where it has
    one that can run the input, else `composed`. With MOE_NATIVE off (`config.native` False) always `composed`,
    whose expert dispatcher then runs the reference experts, as before this table existed."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens={num_tokens}: an MoE call needs at least one token")
    if config is not None and not config.native:
        return "composed"
    measured = table_path_for(
        "moe_block", num_tokens, device, dtype,
        lambda name: MOE_BLOCK_PATHS.can_run(name, num_tokens, dtype, device),
    )
    return "composed" if measured is None else measured


def moe_block(
    x: torch.Tensor,
    w: MoEWeights,
    config: MoEConfig | None = None,
    router: Router = "topk_softmax",
    block: str | None = None,
) -> torch.Tensor:
    """The MoE block of x [T, H] in x's dtype, by the path `block` names, or (None) the one `select_block_path`
    picks: with no dispatch table (every CPU) that is `composed`, today's block bit for bit."""
    config = MoEConfig() if config is None else config
    if block is None:
        block = select_block_path(x.shape[0], x.device, x.dtype, config)
        path = MOE_BLOCK_PATHS[block]  # checked by the selection
    else:
        path = MOE_BLOCK_PATHS.checked(block, x.shape[0], x.dtype, x.device)
    return path.fn(x, w, config, router)
