"""Gated DeltaNet: the delta-rule path table, the causal conv, the projection layouts, the layer and its
whole-layer decode paths."""
from .conv import CONV_PATHS, ConvPath, conv_prefill, conv_reference, conv_update, run_conv_path, zero_conv_state
from .decode_layer import GDN_DECODE_LAYER_PATHS, run_decode_layer, select_decode_layer_path
from .layer import gdn_layer, served_decode_layer
from .staged import gdn_gating, select_conv_path, select_gated_norm_path, select_rule_path
from .weights import GDNState, GDNWeights
from .layout import GDNDims, qwen35_to_qwen3_next, qwen3_next_to_qwen35
from .rule import (
    CHUNK_SIZE,
    GDN_RULE_PATHS,
    GDNRulePath,
    gdn_rule_paths_for,
    l2norm,
    register_gdn_rule_path,
    rule_output_dtype,
    run_gdn_rule,
    state_dtype,
)
from . import fla_paths  # noqa: F401  (registers the fla-core paths; they import fla only when used on CUDA)

__all__ = [
    "CHUNK_SIZE",
    "CONV_PATHS",
    "ConvPath",
    "GDNDims",
    "GDNRulePath",
    "GDNState",
    "GDNWeights",
    "GDN_DECODE_LAYER_PATHS",
    "GDN_RULE_PATHS",
    "served_decode_layer",
    "conv_prefill",
    "conv_reference",
    "conv_update",
    "gdn_gating",
    "gdn_layer",
    "gdn_rule_paths_for",
    "l2norm",
    "qwen35_to_qwen3_next",
    "qwen3_next_to_qwen35",
    "register_gdn_rule_path",
    "rule_output_dtype",
    "run_conv_path",
    "run_decode_layer",
    "run_gdn_rule",
    "select_conv_path",
    "select_decode_layer_path",
    "select_gated_norm_path",
    "select_rule_path",
    "state_dtype",
    "zero_conv_state",
]
