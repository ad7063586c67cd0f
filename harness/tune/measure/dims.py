"""The shapes the tuner times: the MoE block's, the GDN layer's and the full-attention layer's per-rank dims, and
the sweep points."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from model.attention.layer import AttentionDims
from model.gdn import GDNDims

__all__ = ["MoEDims", "TuneDims", "REAL_PER_RANK", "TINY", "dims_from_hf_config", "recorded_dims",
           "MOE_TOKENS", "MOE_BLOCK_TOKENS", "GDN_PREFILL_TOKENS", "GDN_DECODE_BATCHES", "ATTENTION_CONTEXT",
           "attention_context"]


@dataclass(frozen=True)
class MoEDims:
    hidden: int
    experts: int
    top_k: int
    intermediate: int  # per rank
    shared_intermediate: int  # per rank


@dataclass(frozen=True)
class TuneDims:
    name: str
    moe: MoEDims
    gdn: GDNDims
    attention: AttentionDims

    def as_dict(self) -> dict:
        return {"name": self.name, "moe": asdict(self.moe), "gdn": asdict(self.gdn), "attention": asdict(self.attention)}


# Qwen3.6-35B-A3B under TP=4: hidden 2048; 256 experts, top-8, expert and shared intermediate 512 / 4 = 128;
# GDN 16 key heads / 4 = 4, 32 value heads / 4 = 8, head dims 128, conv kernel 4; full attention 16 query heads / 4
# = 4, its 2 kv heads replicated to 1 a rank (fewer than the ranks), head dim 256, a quarter of it rotated (64),
# RoPE theta 1e7.
REAL_PER_RANK = TuneDims(
    "qwen3.6-35b-a3b-tp4",
    MoEDims(hidden=2048, experts=256, top_k=8, intermediate=128, shared_intermediate=128),
    GDNDims(hidden_size=2048, num_k_heads=4, num_v_heads=8, head_k_dim=128, head_v_dim=128, conv_kernel=4),
    AttentionDims(hidden_size=2048, num_heads=4, num_kv_heads=1, head_dim=256, rotary_dim=64, rope_theta=1e7),
)
# The real model's ratios at a size a CPU times in seconds (CI's end-to-end check).
TINY = TuneDims(
    "tiny",
    MoEDims(hidden=32, experts=8, top_k=2, intermediate=16, shared_intermediate=16),
    GDNDims(hidden_size=32, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16, conv_kernel=4),
    AttentionDims(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16, rotary_dim=4, rope_theta=1e7),
)


def dims_from_hf_config(model_dir: Path, tp: int) -> TuneDims:
    """Per-rank dims from an HF checkpoint's config.json, split over `tp` ranks as vLLM shards them."""
    from model.qwen36.config import Qwen36Config
    from model.tp import kv_heads_for_rank
    from model.tp.common import check_divisible

    cfg = Qwen36Config.from_pretrained_dir(model_dir)
    g, a = cfg.gdn_dims, cfg.attention_dims
    return TuneDims(
        f"{Path(model_dir).name}-tp{tp}",
        MoEDims(
            hidden=cfg.hidden_size,
            experts=cfg.num_experts,
            top_k=cfg.num_experts_per_tok,
            intermediate=check_divisible("moe_intermediate_size", cfg.moe_intermediate_size, tp),
            shared_intermediate=check_divisible("shared_expert_intermediate_size", cfg.shared_expert_intermediate_size, tp),
        ),
        GDNDims(
            hidden_size=g.hidden_size,
            num_k_heads=check_divisible("linear_num_key_heads", g.num_k_heads, tp),
            num_v_heads=check_divisible("linear_num_value_heads", g.num_v_heads, tp),
            head_k_dim=g.head_k_dim,
            head_v_dim=g.head_v_dim,
            conv_kernel=g.conv_kernel,
            eps=g.eps,
        ),
        replace(a, num_heads=check_divisible("num_attention_heads", a.num_heads, tp),
                num_kv_heads=len(kv_heads_for_rank(0, tp, a.num_kv_heads))),  # replicated below one a rank
    )


# Sweep points (the issues' lists): T = 1..16 then powers of two to 8192 for the routed experts; the whole
# block at 1, 8, 4096; GDN prefill at B = 1 for T = 64..16384; GDN decode steps at these batch sizes.
def recorded_dims(name: str, hf_config: Path | None, tp: int) -> TuneDims | None:
    """The dims a table was recorded at, for re-timing it: a checkpoint's config when one is given, else the
    built-in dims of that name (None: a name this code does not know)."""
    if hf_config is not None:
        return dims_from_hf_config(hf_config, tp)
    return {REAL_PER_RANK.name: REAL_PER_RANK, TINY.name: TINY}.get(name)


MOE_TOKENS = tuple(range(1, 17)) + tuple(2**p for p in range(5, 14))
MOE_BLOCK_TOKENS = (1, 8, 4096)
GDN_PREFILL_TOKENS = tuple(2**p for p in range(6, 15))
GDN_DECODE_BATCHES = (1, 8, 64, 256)
# The keys already cached when the full-attention decode layer is timed: the decode step's prompt
# (harness/tune/step/run.py STEP_PREFILL), so the layer's rows and the step's attention time the same work.
ATTENTION_CONTEXT = 256
TINY_ATTENTION_CONTEXT = 16


def attention_context(dims: TuneDims) -> int:
    """The cached keys the attention decode layer is timed over at these dims (a CPU times the tiny dims)."""
    return TINY_ATTENTION_CONTEXT if dims.name == TINY.name else ATTENTION_CONTEXT
