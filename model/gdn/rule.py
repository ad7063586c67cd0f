"""The gated delta rule: one float64 recurrent reference and the optimised forms, registered in one table.

For each value head j (reading key head j // (HV / H)) and token t, with state S [K, V]:
    q_t <- l2norm(q_t) / sqrt(K),   k_t <- l2norm(k_t)          (l2norm(x) = x * rsqrt(sum(x^2) + 1e-6))
    S   <- exp(g_t) * S
    S   <- S + k_t (beta_t * (v_t - k_t^T S))^T                  (the delta rule write)
    o_t <- S^T q_t
Conventions follow HF transformers' Qwen3.5/Qwen3-Next and FLA: the state layout is [B, HV, K, V] and it is
kept in float32 (float64 in the reference); `g` is the log decay (<= 0), `beta` the write strength in (0, 1).

Calling convention (HF/FLA tensor layout, batch first):
    fn(q [B,T,H,K], k [B,T,H,K], v [B,T,HV,V], g [B,T,HV], beta [B,T,HV],
       initial_state [B,HV,K,V] or None, out [B,T,HV,V], final_state [B,HV,K,V]) -> (out, final_state)
A path overwrites every element of `out` and `final_state` (tests poison both with NaN) and never modifies
`initial_state` (the caller may hand the same state to several paths).
Tests iterate `GDN_RULE_PATHS`, so a path is tested the moment it is registered.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dispatch.paths import ComputePath, PathTable, always_float64, compute_dtype

__all__ = [
    "CHUNK_SIZE",
    "GDNRulePath",
    "GDN_RULE_PATHS",
    "register_gdn_rule_path",
    "gdn_rule_paths_for",
    "run_gdn_rule",
    "rule_output_dtype",
    "state_dtype",
    "l2norm",
]

CHUNK_SIZE = 64
L2NORM_EPS = 1e-6

GDNRulePath = ComputePath  # the name this module's table records had before the generic table

# Low-precision paths keep the state in float32 (mamba_ssm_dtype): ComputePath's default state rule.
GDN_RULE_PATHS = PathTable("gated delta rule path")
register_gdn_rule_path = GDN_RULE_PATHS.register
gdn_rule_paths_for = GDN_RULE_PATHS.paths_for


def rule_output_dtype(name: str, input_dtype: torch.dtype) -> torch.dtype:
    return GDN_RULE_PATHS[name].output_dtype(input_dtype)


def state_dtype(name: str, input_dtype: torch.dtype) -> torch.dtype:
    """float32 state for every low-precision path (mamba_ssm_dtype), float64 in the reference."""
    return GDN_RULE_PATHS[name].state_dtype(input_dtype)


def _check_shapes(q, k, v, g, beta, initial_state) -> None:
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must both be [B, T, H, K]")
    batch, tokens, heads, _ = q.shape
    if v.dim() != 4 or v.shape[:2] != (batch, tokens):
        raise ValueError(f"v {tuple(v.shape)} must be [B, T, HV, V] with B, T = {batch}, {tokens} as in q")
    v_heads = v.shape[2]
    if v_heads % heads:
        raise ValueError(f"{v_heads} value heads are not a multiple of {heads} key heads (value head j reads key head j // (HV/H))")
    for name, t in (("g", g), ("beta", beta)):
        if t.shape != (batch, tokens, v_heads):
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [B, T, HV] = {(batch, tokens, v_heads)}")
    if initial_state is not None and initial_state.shape != (batch, v_heads, q.shape[3], v.shape[3]):
        raise ValueError(
            f"initial_state has shape {tuple(initial_state.shape)}; expected [B, HV, K, V] = "
            f"{(batch, v_heads, q.shape[3], v.shape[3])} (HF layout; transpose a [HV, V, K] kernel state first)"
        )


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """FLA's / HF's l2norm: x * rsqrt(sum(x^2) + 1e-6) over the head dim."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _prepare(q, k, v, g, beta, ct):
    """Heads-first [B, HV, T, *] tensors in `ct`: l2-normalised q (scaled) and k expanded to value heads."""
    group = v.shape[2] // q.shape[2]
    q, k = l2norm(q.to(ct)), l2norm(k.to(ct))
    q = q * q.shape[-1] ** -0.5
    # Value head j reads key head j // group: repeat_interleave, not repeat.
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    return [t.transpose(1, 2).to(ct) for t in (q, k, v)] + [t.transpose(1, 2).to(ct) for t in (g, beta)]


def _initial(initial_state, shape, ct, device) -> torch.Tensor:
    if initial_state is None:
        return torch.zeros(shape, dtype=ct, device=device)
    return initial_state.to(ct).clone()


# --- recurrent reference: token by token in float64 ---------------------------------------------------

def rule_recurrent_reference(q, k, v, g, beta, initial_state, out, final_state):
    """The definition, one token at a time, in float64 (written for clarity, not speed)."""
    ct = torch.float64
    q, k, v, g, beta = _prepare(q, k, v, g, beta, ct)  # [B, HV, T, *]
    batch, v_heads, tokens, k_dim = k.shape
    state = _initial(initial_state, (batch, v_heads, k_dim, v.shape[-1]), ct, q.device)
    for t in range(tokens):
        state = state * g[:, :, t, None, None].exp()
        predicted = torch.einsum("bhk,bhkv->bhv", k[:, :, t], state)
        delta = beta[:, :, t, None] * (v[:, :, t] - predicted)
        state = state + k[:, :, t, :, None] * delta[:, :, None, :]
        out[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, :, t], state).to(out.dtype)
    final_state.copy_(state)
    return out, final_state


# --- decode: one token, vectorised, float32 state -------------------------------------------------

def rule_decode_step(q, k, v, g, beta, initial_state, out, final_state):
    """T == 1 (the LOOP1 decode step): the same update as the reference in float32, as batched matvecs."""
    ct = compute_dtype(v.dtype)
    q, k, v, g, beta = (t[:, :, 0] for t in _prepare(q, k, v, g, beta, ct))  # [B, HV, *]
    batch, v_heads, k_dim = k.shape
    state = _initial(initial_state, (batch, v_heads, k_dim, v.shape[-1]), ct, q.device)
    state.mul_(g.exp()[..., None, None])
    predicted = (k.unsqueeze(-2) @ state).squeeze(-2)  # [B, HV, V]
    delta = beta[..., None] * (v - predicted)
    state.add_(k.unsqueeze(-1) * delta.unsqueeze(-2))
    out[:, 0] = (q.unsqueeze(-2) @ state).squeeze(-2).to(out.dtype)
    final_state.copy_(state)
    return out, final_state


# --- chunked: chunks of 64 tokens, UT transform inside a chunk, a scan over chunks --------------

def _segment_sum(g: torch.Tensor) -> torch.Tensor:
    """seg[..., i, j] = g[j+1] + ... + g[i] for j <= i, -inf for j > i (Mamba2's `segsum`).

    HF and FLA take exp(cum_i - cum_j) from one cumsum per chunk; in float32 that difference cancels
    catastrophically on fast-decaying heads (cum ~ -700 leaves ~4e-5 relative error in exp). Summing each
    segment directly keeps the error at float32 epsilon times the segment's own length.
    """
    size = g.shape[-1]
    lower = torch.ones(size, size, dtype=torch.bool, device=g.device).tril(-1)
    terms = g[..., :, None].expand(*g.shape, size).masked_fill(~lower, 0.0)  # terms[i, j] = g_i for i > j
    seg = terms.cumsum(dim=-2)
    return seg.masked_fill(~lower.logical_or(torch.eye(size, dtype=torch.bool, device=g.device)), float("-inf"))


def rule_chunked(q, k, v, g, beta, initial_state, out, final_state, chunk_size: int = CHUNK_SIZE):
    """The chunked form (CHUNK_PARALLEL; HF's torch_chunk_gated_delta_rule): any length, zero-padded.

    Same algorithm as HF's, except that decays between positions come from segment sums (`_segment_sum`).

    Zero padding at the end is exact: a padded token has k = v = 0, g = 0 and beta = 0, so it neither
    decays nor writes the state, and its outputs are dropped.
    """
    ct = compute_dtype(v.dtype)
    q, k, v, g, beta = _prepare(q, k, v, g, beta, ct)  # [B, HV, T, *]
    batch, v_heads, tokens, k_dim = k.shape
    v_dim = v.shape[-1]
    pad = (-tokens) % chunk_size
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    num_chunks = (tokens + pad) // chunk_size

    def chunks(t):  # [B, HV, N, C, *]
        return t.reshape(batch, v_heads, num_chunks, chunk_size, *t.shape[3:])

    k_beta, v_beta = chunks(k * beta[..., None]), chunks(v * beta[..., None])
    q, k, g = chunks(q), chunks(k), chunks(g)
    cum = g.cumsum(-1)  # log of the decay from the chunk start to each position
    seg = _segment_sum(g)  # seg[i, j] = sum of g over (j, i]; -inf above the diagonal
    pair_decay = seg.exp()  # decay between positions j <= i of a chunk
    # (I + A) u = v_beta, with A strictly lower: the UT transform that batches the chunk's delta writes.
    system = (k_beta @ k.transpose(-1, -2)) * pair_decay
    new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * pair_decay
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * seg[..., -1, :].exp()[..., None]  # decay from each position to the chunk end
    chunk_decay = cum[..., -1].exp()[..., None, None]

    state = _initial(initial_state, (batch, v_heads, k_dim, v_dim), ct, q.device)
    core = torch.empty(batch, v_heads, num_chunks, chunk_size, v_dim, dtype=ct, device=q.device)
    for i in range(num_chunks):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state
        core[:, :, i] = q_decayed[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ v_new
    core = core.reshape(batch, v_heads, -1, v_dim)[:, :, :tokens]
    out.copy_(core.transpose(1, 2))
    final_state.copy_(state)
    return out, final_state


def run_gdn_rule(
    name: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    final_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a registered path by name, checking shapes and that the path supports this input."""
    _check_shapes(q, k, v, g, beta, initial_state)
    path = GDN_RULE_PATHS.checked(name, q.shape[1], v.dtype, v.device)
    batch, _, v_heads, v_dim = v.shape
    if out is None:
        out = torch.empty(v.shape, dtype=path.output_dtype(v.dtype), device=v.device)
    if final_state is None:
        final_state = torch.empty((batch, v_heads, q.shape[3], v_dim), dtype=path.state_dtype(v.dtype), device=v.device)
    return path.fn(q, k, v, g, beta, initial_state, out, final_state)


for _path in (
    ComputePath("recurrent_reference", rule_recurrent_reference, "token loop in float64 (the definition)",
                is_reference=True, output_dtype_rule=always_float64, state_dtype_rule=always_float64),
    ComputePath("chunked", rule_chunked, f"chunks of {CHUNK_SIZE}, UT transform, scan over chunks"),
    ComputePath("decode_step", rule_decode_step, "T == 1: one vectorised step, fp32 state", max_tokens=1),
):
    GDN_RULE_PATHS.register(_path)
