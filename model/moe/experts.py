"""Routed-expert paths: one float64 reference and the optimised rewrites, registered in one table.

Every path computes, for each token t,
    out[t] = sum_j w[t, j] * down_e(silu(gate_e x_t) * up_e x_t),  e = ids[t, j]
with the HF Qwen3.5 layout: `w13 = gate_up_proj [E, 2I, H]` (gate rows first), `w2 = down_proj [E, H, I]`.

Calling convention: `path(x [T, H], w13, w2, weights fp32 [T, k], ids int64 [T, k], out [T, H]) -> out`.
A path must overwrite every element of `out` (tests poison it with NaN first) and return it.
Tests iterate `EXPERT_PATHS`, so a path is tested the moment it is registered. The reference and the
pure-PyTorch rewrites are registered here; a new path is one module in model/moe/expert_paths/ (found and
imported with the package) plus its tolerance in model/tolerances.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dispatch.paths import LOW_PRECISION, ComputePath, PathTable, always_float64, compute_dtype

__all__ = [
    "ExpertPath",
    "EXPERT_PATHS",
    "register_expert_path",
    "expert_paths_for",
    "run_expert_path",
    "experts_reference",
    "experts_magnitude",
    "silu_and_mul",
]

ExpertPath = ComputePath  # the name this module's table records had before the generic table

# Paths beyond the ones below live one module each in model/moe/expert_paths/, which registers them here.
EXPERT_PATHS = PathTable("expert path")
register_expert_path = EXPERT_PATHS.register
expert_paths_for = EXPERT_PATHS.paths_for


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
    path = EXPERT_PATHS.checked(name, x.shape[0], x.dtype, x.device)
    if out is None:
        out = torch.empty(x.shape, dtype=path.output_dtype(x.dtype), device=x.device)
    return path.fn(x, w13, w2, weights, ids, out)


def silu_and_mul(h: torch.Tensor) -> torch.Tensor:
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
        y = silu_and_mul(h) @ w2_64[e].T
        acc.index_add_(0, token_idx, y * weights[token_idx, slot].double()[:, None])
    return out.copy_(acc)


SILU_SLOPE_MAX = 1.1  # sup |silu'(z)| is about 1.0998: how far an error in the gate can move silu(gate)


def experts_magnitude(x, w13, w2, weights, ids) -> float:
    """The size of the terms the routed experts sum, in float64: what rounding error is proportional to, so a
    path's error is measured against it rather than against an output that can nearly cancel.

    The reference's computation with every sum taken over absolute values (the classic forward error bound of a
    dot product, |fl(a.b) - a.b| <= n u |a|.|b|), carried through silu(gate) * up to first order:
    |act| <= |silu(gate)| |x||W_up| + SILU_SLOPE_MAX |x||W_gate| |up|, then |W2| |act|, then |w_k| summed over the
    top-k. Elementwise it bounds |reference| from above, so the error it gives is never larger than against
    ||reference||."""
    x64, w13_64, w2_64 = x.double(), w13.double(), w2.double()
    acc = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in torch.unique(ids).tolist():
        token_idx, slot = torch.where(ids == e)
        gate, up = (x64[token_idx] @ w13_64[e].T).chunk(2, dim=-1)
        gate_abs, up_abs = (x64[token_idx].abs() @ w13_64[e].abs().T).chunk(2, dim=-1)
        act = F.silu(gate).abs() * up_abs + SILU_SLOPE_MAX * gate_abs * up.abs()
        acc.index_add_(0, token_idx, (act @ w2_64[e].abs().T) * weights[token_idx, slot].double().abs()[:, None])
    return acc.norm().item()


# --- decode: T == 1 ----------------------------------------------------------------------------------

def experts_decode_fused(x, w13, w2, weights, ids, out):
    """T == 1: the top-k `w13` matrices stacked into one `F.linear`, then one `bmm` for down."""
    top_k, two_i, hidden = ids.shape[1], w13.shape[1], w13.shape[2]
    sel = ids[0]
    h = F.linear(x, w13[sel].reshape(top_k * two_i, hidden)).view(top_k, two_i)
    y = torch.bmm(w2[sel], silu_and_mul(h).unsqueeze(-1)).squeeze(-1)  # [k, H]
    acc = compute_dtype(x.dtype)
    out[0] = (y.to(acc) * weights[0, :, None].to(acc)).sum(0).to(out.dtype)
    return out


# --- tiny batches: 1 <= T <= TINY_MAX -------------------------------------------------------------------

def experts_tiny_bmm(x, w13, w2, weights, ids, out):
    """All T * k (token, expert) pairs flattened into two batched `bmm`s, no Python loop."""
    num_tokens, top_k = ids.shape
    flat = ids.reshape(-1)
    x_rep = x.repeat_interleave(top_k, dim=0).unsqueeze(-1)  # [T*k, H, 1]
    h = torch.bmm(w13[flat], x_rep).squeeze(-1)  # [T*k, 2I]
    y = torch.bmm(w2[flat], silu_and_mul(h).unsqueeze(-1)).squeeze(-1)  # [T*k, H]
    acc = compute_dtype(x.dtype)
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
    flat_weights = weights.reshape(-1).to(compute_dtype(x.dtype))
    acc = torch.zeros(x.shape, dtype=flat_weights.dtype, device=x.device)
    start = 0
    for e, count in enumerate(counts.tolist()):  # one device sync for all counts
        if count == 0:
            continue
        slots = order[start : start + count]
        tokens = slots // top_k
        h = F.linear(x[tokens], w13[e])
        y = F.linear(silu_and_mul(h), w2[e])
        acc.index_add_(0, tokens, y.to(acc.dtype) * flat_weights[slots, None])
        start += count
    return out.copy_(acc)


def _grouped_mm_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    if not hasattr(torch, "_grouped_mm"):
        return f"this torch build ({torch.__version__}) has no torch._grouped_mm"
    if device.type == "cuda":
        # The CUDA kernel is Hopper-or-newer and bfloat16-only.
        if dtype != torch.bfloat16:
            return f"torch._grouped_mm on CUDA takes bfloat16 only, not {dtype}"
        if torch.cuda.get_device_capability(device)[0] < 9:
            return "torch._grouped_mm on CUDA needs a Hopper-or-newer GPU (compute capability 9+)"
    return None


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
    y = torch._grouped_mm(silu_and_mul(h), w2_p.transpose(1, 2), offs=offsets)[:, : x.shape[1]]
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    acc.index_add_(0, tokens, y.float() * weights.reshape(-1)[order, None])
    return out.copy_(acc)


for _path in (
    ComputePath("reference", experts_reference, "per-expert loop in float64 (the definition)", is_reference=True,
                output_dtype_rule=always_float64),
    ComputePath("decode_fused", experts_decode_fused, "T == 1: one stacked F.linear + bmm", max_tokens=1),
    ComputePath("tiny_bmm", experts_tiny_bmm, "T*k pairs as two batched bmm"),
    ComputePath("tiny_tokenwise", experts_tiny_tokenwise, "T == 1 fused path per token"),
    ComputePath("sorted", experts_sorted, "tokens sorted by expert, one GEMM pair per expert"),
    ComputePath(
        "grouped_mm",
        experts_grouped_mm,
        "tokens sorted by expert, torch._grouped_mm",
        dtypes=LOW_PRECISION,  # torch._grouped_mm has no float64 kernel
        why_unavailable=_grouped_mm_unavailable,
    ),
):
    EXPERT_PATHS.register(_path)
