"""Which dispatch-table choice a timed row stands for.

Two dispatch blocks choose a whole block's path, and their rows keep the names they had before those blocks
existed, so that tables recorded earlier still judge:
- `moe_block` rows named by a routed-expert path are the `composed` block with those experts (the row the
  `moe_experts` ranges are ranked by at the block's points); rows named by a fused block path are that path.
- `gdn_layer_decode` rows named `layer` are the `staged` layer (each stage timed alone has its stage's name:
  `in_proj`, `conv`, ...; those stand for no choice); rows named by a fused decode-layer path are that path.
"""
from __future__ import annotations

from model.gdn import GDN_DECODE_LAYER_PATHS
from model.moe import EXPERT_PATHS, MOE_BLOCK_PATHS

__all__ = ["COMPOSED", "STAGED", "STAGED_ROW", "block_choice", "fused_block_paths", "fused_layer_paths",
           "is_layer_row"]

COMPOSED, STAGED = "composed", "staged"
VLLM = "vllm"  # vLLM's own layer: the plugin's served blocks leave it in place where it won
STAGED_ROW = "layer"  # the name the staged GDN layer's whole-layer rows have always had


def fused_block_paths() -> list[str]:
    """The MoE block paths timed beside the composed block (every candidate but `composed`)."""
    return [p.name for p in MOE_BLOCK_PATHS.candidates() if p.name != COMPOSED]


def fused_layer_paths() -> list[str]:
    """The GDN decode-layer paths timed beside the staged layer (every candidate but `staged`)."""
    return [p.name for p in GDN_DECODE_LAYER_PATHS.candidates() if p.name != STAGED]


def is_layer_row(block: str, path: str) -> bool:
    """A whole GDN layer's row (staged or fused), as opposed to one stage's."""
    return block.startswith("gdn_layer") and (path == STAGED_ROW or path in GDN_DECODE_LAYER_PATHS)


def block_choice(table_block: str, row_block: str, path: str) -> str | None:
    """The choice of dispatch block `table_block` that a row (`row_block`, `path`) stands for, or None when the
    row is not a candidate there."""
    if table_block == "moe_experts":
        if row_block == "moe_experts" or (row_block == "moe_block" and path in EXPERT_PATHS):
            return path
        return None
    if row_block != table_block:
        return None
    if path == VLLM:
        return VLLM  # vLLM's own layer, timed beside the model's paths (harness/tune/blocks/vllm_own.py)
    if table_block == "moe_block":
        return COMPOSED if path in EXPERT_PATHS else path if path in MOE_BLOCK_PATHS else None
    if table_block == "gdn_layer_decode":
        return STAGED if path == STAGED_ROW else path if path in GDN_DECODE_LAYER_PATHS else None
    return path
