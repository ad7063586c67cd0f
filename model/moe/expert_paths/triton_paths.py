"""The Triton expert paths, registered in EXPERT_PATHS: where they can run, and their entry points.

Triton compiles for CUDA GPUs; on the CPU it runs only through its interpreter, which is chosen when the
kernels are defined (TRITON_INTERPRET=1 in the environment before this package is imported), and then the
same kernels no longer run on a GPU. Without Triton installed both paths are registered but unavailable.
"""
from __future__ import annotations

import torch

from ...dispatch import triton_support
from ...dispatch.paths import LOW_PRECISION, ComputePath
from ..experts import EXPERT_PATHS

try:
    import triton  # noqa: F401  (only whether it imports)
except ImportError:  # a torch build or platform without Triton
    triton = None

if triton is not None:
    from .. import triton_decode, triton_grouped

__all__ = ["triton_unavailable_reason", "experts_triton_decode", "experts_triton_grouped"]


def triton_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    return triton_support.unavailable_reason(device, None if triton is None else triton_decode.INTERPRETED)


def _run(launch, x, w13, w2, weights, ids, out):
    x, w13, w2 = (triton_support.last_dim_contiguous(t) for t in (x, w13, w2))
    if out.stride(-1) == 1:
        return launch(x, w13, w2, weights, ids, out)
    return out.copy_(launch(x, w13, w2, weights, ids, torch.empty(out.shape, dtype=out.dtype, device=out.device)))


def experts_triton_decode(x, w13, w2, weights, ids, out):
    """Two kernels per call, one program per (token, expert) pair; weights read in place."""
    return _run(triton_decode.experts_triton_decode, x, w13, w2, weights, ids, out)


def experts_triton_grouped(x, w13, w2, weights, ids, out):
    """Pairs grouped by expert on the device, then one grouped GEMM per projection."""
    return _run(triton_grouped.experts_triton_grouped, x, w13, w2, weights, ids, out)


for _path in (
    ComputePath(
        "triton_decode",
        experts_triton_decode,
        "Triton, two kernels: gate-up+SiLU per (token, expert) pair, down + top-k sum per token",
        # Each pair reads its expert's weights, so past a few hundred tokens the grouped paths win by
        # far; the cap keeps sweeps over T from timing that hopeless range.
        max_tokens=256,
        dtypes=LOW_PRECISION,
        why_unavailable=triton_unavailable_reason,
    ),
    ComputePath(
        "triton_grouped",
        experts_triton_grouped,
        "Triton: pairs grouped by expert on the device, grouped GEMMs, capturable",
        dtypes=LOW_PRECISION,
        why_unavailable=triton_unavailable_reason,
    ),
):
    EXPERT_PATHS.register(_path)
