"""Qwen3.5/3.6 sparse MoE: router variants, the expert-path table, the dispatcher, the block and its path table."""
from .block import MOE_HF_NAMES, MoEWeights, fuse_per_expert_weights, moe_block_reference, shared_expert
from .block_paths import MOE_BLOCK_PATHS, moe_block, select_block_path
from .config import MoEConfig, MoEConfigError
from .graphed_block import GraphedMoEBlock
from .dispatch import dispatch_experts, select_expert_path
from .experts import EXPERT_PATHS, ExpertPath, expert_paths_for, register_expert_path, run_expert_path
from . import expert_paths  # noqa: F401  (each module there registers its paths into EXPERT_PATHS)
from .router import (
    ROUTERS, RouterPath, route_reference, route_topk_softmax, route_triton_fused, topk_lowest_id_on_ties,
)

__all__ = [
    "EXPERT_PATHS",
    "ExpertPath",
    "GraphedMoEBlock",
    "MOE_BLOCK_PATHS",
    "MOE_HF_NAMES",
    "MoEConfig",
    "MoEConfigError",
    "MoEWeights",
    "ROUTERS",
    "RouterPath",
    "dispatch_experts",
    "expert_paths_for",
    "fuse_per_expert_weights",
    "moe_block",
    "moe_block_reference",
    "register_expert_path",
    "route_reference",
    "route_topk_softmax",
    "route_triton_fused",
    "run_expert_path",
    "select_block_path",
    "select_expert_path",
    "shared_expert",
    "topk_lowest_id_on_ties",
]
