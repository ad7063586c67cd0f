"""Gated delta rule paths backed by fla-core (flash-linear-attention's Triton kernels), in GDN_RULE_PATHS.

- `fla_chunk`: `fla.ops.gated_delta_rule.chunk_gated_delta_rule`, the chunked form (any T; built for prefill).
- `fla_recurrent`: the kernel behind `fused_recurrent_gated_delta_rule`, one program per (sequence, value
  head, 8 columns of V) looping over the tokens (any T; built for the T == 1 decode step). It is launched
  here with the caller's `out` and `final_state` as its outputs: fla's wrapper allocates a new state, and
  copying that into `final_state` would move the whole state a second time (128 MB at decode batch 256).

The conventions match the float64 reference in model.gdn.rule:
- grouped value heads: fla's kernels read key head `i_hv // (HV // H)` for value head `i_hv` (its GVA),
  the reference's j // (HV / H); q and k go in with H heads, unexpanded.
- `use_qk_l2norm_in_kernel=True` normalises q and k as x / sqrt(sum(x^2) + 1e-6), the reference's l2norm,
  and `scale = K ** -0.5` multiplies the normalised q, as the reference does.
- g is the natural-log decay and beta the post-sigmoid write strength (no gate or sigmoid in the kernel);
  the state is [B, HV, K, V] in float32 (`state_v_first=False`), read from `initial_state`, never written.

Available only where fla imports and the tensors are on CUDA. fla-core is the optional extra `gpu` of
pyproject.toml; on a CPU the paths say why they cannot run and fla is never imported.
"""
from __future__ import annotations

import functools

import torch

from ..dispatch.paths import ComputePath
from .rule import GDN_RULE_PATHS

__all__ = ["fla_unavailable_reason", "rule_fla_chunk", "rule_fla_recurrent"]

FLA_EXTRA_HINT = "install the optional extra: pip install 'qwen36-serving[gpu]' (fla-core>=0.6)"


@functools.cache
def _fla_import_error() -> str | None:
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception as exc:  # ImportError, or Triton failing at import on this machine
        return f"fla-core cannot be imported ({type(exc).__name__}: {exc}); {FLA_EXTRA_HINT}"
    return None


def fla_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why fla's kernels cannot run here, or None. The device is checked first, so a CPU never imports fla."""
    if device.type != "cuda":
        return f"fla-core's Triton kernels need a CUDA device; this is {device.type}"
    return _fla_import_error()


def _float32_state(initial_state: torch.Tensor | None) -> torch.Tensor | None:
    # fla reads h0 in place; .to / .contiguous copy only when needed, and fla never writes it.
    return None if initial_state is None else initial_state.to(torch.float32).contiguous()


def rule_fla_chunk(q, k, v, g, beta, initial_state, out, final_state):
    """fla's chunked gated delta rule (chunks of 64, WY representation), copied into out / final_state."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    o, ht = chunk_gated_delta_rule(
        q, k, v, g, beta,
        scale=q.shape[-1] ** -0.5,
        initial_state=_float32_state(initial_state),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    out.copy_(o)
    final_state.copy_(ht)
    return out, final_state


def rule_fla_recurrent(q, k, v, g, beta, initial_state, out, final_state):
    """fla's fused recurrent kernel, writing straight into out / final_state (when they are contiguous)."""
    import triton
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd_kernel as kernel

    batch, tokens, heads, k_dim = q.shape
    v_heads, v_dim = v.shape[2], v.shape[3]
    o = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
    direct_state = final_state.is_contiguous() and final_state.dtype == torch.float32
    ht = final_state if direct_state else torch.empty(final_state.shape, dtype=torch.float32, device=v.device)
    block_v = min(8, triton.next_power_of_2(v_dim))  # fla's own tile for this kernel
    grid = (triton.cdiv(v_dim, block_v) * batch * v_heads,)
    with torch.cuda.device(v.device):
        kernel[grid](
            q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=g.contiguous(), gk=None, gv=None,
            beta=beta.contiguous(), A_log=None, dt_bias=None, o=o, h0=_float32_state(initial_state), ht=ht,
            cu_seqlens=None, scale=k_dim ** -0.5, T=tokens, H=heads, HV=v_heads, K=k_dim, V=v_dim,
            BK=triton.next_power_of_2(k_dim), BV=block_v,
            USE_QK_L2NORM_IN_KERNEL=True, IS_BETA_HEADWISE=True, APPLY_BETA_SIGMOID=False,
            ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=False, num_warps=1, num_stages=3,
        )
    if o is not out:
        out.copy_(o)
    if ht is not final_state:
        final_state.copy_(ht)
    return out, final_state


for _path in (
    ComputePath(
        "fla_chunk", rule_fla_chunk,
        # bf16 only: for float32 inputs fla's dots run in tf32 (~1e-3 relative), outside the float32 bound.
        dtypes=(torch.bfloat16,),
        why_unavailable=fla_unavailable_reason,
        description="fla-core chunk_gated_delta_rule (chunked prefill, Triton)",
    ),
    ComputePath(
        "fla_recurrent", rule_fla_recurrent,
        dtypes=(torch.float32, torch.bfloat16),  # float32 arithmetic throughout, no dots
        why_unavailable=fla_unavailable_reason,
        description="fla-core fused recurrent kernel (decode step, Triton)",
    ),
):
    GDN_RULE_PATHS.register(_path)
