"""Routed-expert paths: one float64 reference and the optimised rewrites, registered in one table.

Every path computes, for each token t,
    out[t] = sum_j w[t, j] * down_e(silu(gate_e x_t) * up_e x_t),  e = ids[t, j]
with the HF Qwen3.5 layout: `w13 = gate_up_proj [E, 2I, H]` (gate rows first), `w2 = down_proj [E, H, I]`.

Calling convention: `path(x [T, H], w13, w2, weights fp32 [T, k], ids int64 [T, k], out [T, H]) -> out`.
A path must overwrite every element of `out` (tests poison it with NaN first) and return it.
Tests iterate `EXPERT_PATHS`, so a path is tested the moment it is registered.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from .triton_paths import experts_triton_decode, experts_triton_grouped, triton_runs_on

__all__ = [
    "ExpertPath",
    "EXPERT_PATHS",
    "register_expert_path",
    "expert_paths_for",
    "run_expert_path",
]

ExpertFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]

LOW_PRECISION = (torch.float32, torch.bfloat16, torch.float16)
ALL_FLOATS = LOW_PRECISION + (torch.float64,)


@dataclass(frozen=True)
class ExpertPath:
    """A registered expert path and what it supports."""

    name: str
    fn: ExpertFn
    min_tokens: int = 1
    max_tokens: int | None = None  # None: no upper bound
    dtypes: tuple[torch.dtype, ...] = ALL_FLOATS
    # Extra run-time condition (for example, an operator that exists only in some torch builds).
    available: Callable[[torch.device, torch.dtype], bool] = field(default=lambda device, dtype: True)
    description: str = ""

    def supports(self, num_tokens: int, dtype: torch.dtype, device: torch.device | str) -> bool:
        device = torch.device(device)
        if num_tokens < self.min_tokens:
            return False
        if self.max_tokens is not None and num_tokens > self.max_tokens:
            return False
        return dtype in self.dtypes and self.available(device, dtype)


EXPERT_PATHS: dict[str, ExpertPath] = {}


def register_expert_path(path: ExpertPath) -> ExpertPath:
    if path.name in EXPERT_PATHS:
        raise ValueError(f"expert path {path.name!r} is already registered")
    EXPERT_PATHS[path.name] = path
    return path


def expert_paths_for(num_tokens: int, dtype: torch.dtype, device: torch.device | str) -> list[ExpertPath]:
    return [p for p in EXPERT_PATHS.values() if p.supports(num_tokens, dtype, device)]


def run_expert_path(
    name: str,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run a registered path by name, checking that it supports this input."""
    try:
        path = EXPERT_PATHS[name]
    except KeyError:
        raise KeyError(f"unknown expert path {name!r}; registered: {sorted(EXPERT_PATHS)}") from None
    if not path.supports(x.shape[0], x.dtype, x.device):
        raise ValueError(
            f"expert path {name!r} does not support T={x.shape[0]} {x.dtype} on {x.device} "
            f"(tokens {path.min_tokens}..{path.max_tokens or 'any'}, dtypes {path.dtypes})"
        )
    if out is None:
        out = torch.empty(x.shape, dtype=path_output_dtype(name, x.dtype), device=x.device)
    return path.fn(x, w13, w2, weights, ids, out)


def path_output_dtype(name: str, input_dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if name == "reference" else input_dtype


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulate the weighted sum over experts in float32, or float64 for float64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _silu_and_mul(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


# --- reference ---------------------------------------------------------------------------------------

def experts_reference(x, w13, w2, weights, ids, out):
    """Per-expert loop in float64: the definition, written for clarity."""
    x64, w13_64, w2_64 = x.double(), w13.double(), w2.double()
    acc = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in torch.unique(ids).tolist():
        token_idx, slot = torch.where(ids == e)
        h = x64[token_idx] @ w13_64[e].T
        y = _silu_and_mul(h) @ w2_64[e].T
        acc.index_add_(0, token_idx, y * weights[token_idx, slot].double()[:, None])
    return out.copy_(acc)


# --- decode: T == 1 ----------------------------------------------------------------------------------

def experts_decode_fused(x, w13, w2, weights, ids, out):
    """T == 1: the top-k `w13` matrices stacked into one `F.linear`, then one `bmm` for down."""
    top_k, two_i, hidden = ids.shape[1], w13.shape[1], w13.shape[2]
    sel = ids[0]
    h = F.linear(x, w13[sel].reshape(top_k * two_i, hidden)).view(top_k, two_i)
    y = torch.bmm(w2[sel], _silu_and_mul(h).unsqueeze(-1)).squeeze(-1)  # [k, H]
    acc = _acc_dtype(x.dtype)
    out[0] = (y.to(acc) * weights[0, :, None].to(acc)).sum(0).to(out.dtype)
    return out


# --- tiny batches: 1 <= T <= TINY_MAX -------------------------------------------------------------------

def experts_tiny_bmm(x, w13, w2, weights, ids, out):
    """All T * k (token, expert) pairs flattened into two batched `bmm`s, no Python loop."""
    num_tokens, top_k = ids.shape
    flat = ids.reshape(-1)
    x_rep = x.repeat_interleave(top_k, dim=0).unsqueeze(-1)  # [T*k, H, 1]
    h = torch.bmm(w13[flat], x_rep).squeeze(-1)  # [T*k, 2I]
    y = torch.bmm(w2[flat], _silu_and_mul(h).unsqueeze(-1)).squeeze(-1)  # [T*k, H]
    acc = _acc_dtype(x.dtype)
    y = y.view(num_tokens, top_k, -1).to(acc) * weights[:, :, None].to(acc)
    return out.copy_(y.sum(1))


def experts_tiny_tokenwise(x, w13, w2, weights, ids, out):
    """Each token through the T == 1 fused path: one larger GEMM per token beats T*k tiny ones."""
    for t in range(ids.shape[0]):
        experts_decode_fused(x[t : t + 1], w13, w2, weights[t : t + 1], ids[t : t + 1], out[t : t + 1])
    return out


# --- prefill: tokens grouped by expert ---------------------------------------------------------------

def _group_by_expert(ids: torch.Tensor, num_experts: int):
    """(flat slot order sorted by expert, per-expert counts). A slot s is token s // k, rank s % k."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return order, counts


def experts_sorted(x, w13, w2, weights, ids, out):
    """Sort (token, expert) pairs by expert; one GEMM pair per expert that has tokens; `index_add_`."""
    top_k = ids.shape[1]
    order, counts = _group_by_expert(ids, w13.shape[0])
    flat_weights = weights.reshape(-1).to(_acc_dtype(x.dtype))
    acc = torch.zeros(x.shape, dtype=flat_weights.dtype, device=x.device)
    start = 0
    for e, count in enumerate(counts.tolist()):  # one device sync for all counts
        if count == 0:
            continue
        slots = order[start : start + count]
        tokens = slots // top_k
        h = F.linear(x[tokens], w13[e])
        y = F.linear(_silu_and_mul(h), w2[e])
        acc.index_add_(0, tokens, y.to(acc.dtype) * flat_weights[slots, None])
        start += count
    return out.copy_(acc)


def _grouped_mm_available(device: torch.device, dtype: torch.dtype) -> bool:
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cuda":
        # The CUDA kernel is Hopper-or-newer and bfloat16-only.
        return dtype == torch.bfloat16 and torch.cuda.get_device_capability(device)[0] >= 9
    return True


def _pad_dim(t: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    """Zero-pad `dim` up to a multiple (zeros leave every product unchanged); no copy when aligned."""
    extra = -t.shape[dim] % multiple
    if extra == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, extra]
    return F.pad(t, pad)


def experts_grouped_mm(x, w13, w2, weights, ids, out):
    """Sorted like `sorted`, but both projections as one `torch._grouped_mm` each, no per-expert loop."""
    top_k, inter = ids.shape[1], w2.shape[2]
    # _grouped_mm needs 16-byte aligned row strides. The real model's dims are aligned (no copy); other
    # shapes are zero-padded, gate and up halves separately so the chunk(2) split stays right.
    multiple = 16 // x.element_size()
    x_p = _pad_dim(x, 1, multiple)
    w13_p, w2_p = w13, w2
    if inter % multiple or x.shape[1] % multiple:
        halves = (w13[:, :inter], w13[:, inter:])
        w13_p = torch.cat([_pad_dim(_pad_dim(half, 2, multiple), 1, multiple) for half in halves], dim=1)
        w2_p = _pad_dim(_pad_dim(w2, 2, multiple), 1, multiple)

    order, counts = _group_by_expert(ids, w13.shape[0])
    tokens = order // top_k
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    h = torch._grouped_mm(x_p[tokens], w13_p.transpose(1, 2), offs=offsets)
    y = torch._grouped_mm(_silu_and_mul(h), w2_p.transpose(1, 2), offs=offsets)[:, : x.shape[1]]
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    acc.index_add_(0, tokens, y.float() * weights.reshape(-1)[order, None])
    return out.copy_(acc)


def _register_builtin(paths: Iterable[ExpertPath]) -> None:
    for path in paths:
        register_expert_path(path)


_register_builtin(
    [
        ExpertPath(
            "reference",
            experts_reference,
            description="per-expert loop in float64 (the definition)",
        ),
        ExpertPath("decode_fused", experts_decode_fused, max_tokens=1, description="T == 1: one stacked F.linear + bmm"),
        ExpertPath("tiny_bmm", experts_tiny_bmm, description="T*k pairs as two batched bmm"),
        ExpertPath("tiny_tokenwise", experts_tiny_tokenwise, description="T == 1 fused path per token"),
        ExpertPath("sorted", experts_sorted, description="tokens sorted by expert, one GEMM pair per expert"),
        ExpertPath(
            "grouped_mm",
            experts_grouped_mm,
            dtypes=LOW_PRECISION,  # torch._grouped_mm has no float64 kernel
            available=_grouped_mm_available,
            description="tokens sorted by expert, torch._grouped_mm",
        ),
        ExpertPath(
            "triton_decode",
            experts_triton_decode,
            # Each pair reads its expert's weights, so past a few hundred tokens the grouped paths win by
            # far; the cap keeps sweeps over T from timing that hopeless range.
            max_tokens=256,
            dtypes=LOW_PRECISION,
            available=triton_runs_on,
            description="Triton, two kernels: gate-up+SiLU per (token, expert) pair, down + top-k sum per token",
        ),
        ExpertPath(
            "triton_grouped",
            experts_triton_grouped,
            dtypes=LOW_PRECISION,
            available=triton_runs_on,
            description="Triton: pairs grouped by expert on the device, grouped GEMMs, capturable",
        ),
    ]
)
