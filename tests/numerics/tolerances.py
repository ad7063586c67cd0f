"""Every numeric bound of the numerics suite, stated once.

Metric: relative error ||out - ref|| / ||ref|| (Frobenius) against a float64 reference computed from the
same low-precision inputs, upcast. Bounds are set with margin over what the paths reach (measured with the
`ci` profile, see the README); float32 paths sit far under 1e-5 and bf16 paths under 2e-2.
Add a block's table here when you add the block; a registered path without an entry fails the suite.
"""
from __future__ import annotations

import torch

F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16

# Routed-expert paths (model.moe.EXPERT_PATHS), per dtype.
MOE_EXPERT_PATHS: dict[str, dict[torch.dtype, float]] = {
    name: {F64: 1e-12, F32: 2e-6, BF16: 1.5e-2, F16: 2e-3}
    for name in ("reference", "decode_fused", "tiny_bmm", "tiny_tokenwise", "sorted", "grouped_mm")
}

# The whole sparse MoE block (router + experts + shared expert), sharded or not.
MOE_BLOCK: dict[torch.dtype, float] = {F64: 1e-12, F32: 2e-6, BF16: 2e-2, F16: 3e-3}

# Router weights of the top-k -> softmax variant against the reference (same logits).
ROUTER_WEIGHTS: dict[torch.dtype, float] = {F32: 1e-6}

# HF transformers blocks against ours, same weights, float32 (independent implementations).
TRANSFORMERS_MOE_F32 = 1e-5


def expert_path_tolerance(name: str, dtype: torch.dtype) -> float:
    try:
        return MOE_EXPERT_PATHS[name][dtype]
    except KeyError:
        raise KeyError(
            f"no tolerance for MoE expert path {name!r} in {dtype}: add it to tests/numerics/tolerances.py"
        ) from None
