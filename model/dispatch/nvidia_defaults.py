"""What an NVIDIA GPU serves where its dispatch table has no row: the paths known to be fast and capturable there.

Without this a GPU that `qwen36 tune` has not seen fell back to the CPU's knob-driven paths: on an H100, 4,107
kernels per decode step at B=1 against 873 with a table (64.1 ms eager against 21.05), and graph capture failing
at B=8 (the `sorted` expert path reads the device on the host). These rows are the choices of the H200 table
(fixtures/dispatch/nvidia-h200.json, recorded with every path timed eager and as a CUDA graph): each one captured
and won there, at every point it was timed. tests/unit/test_dispatch_table.py holds them equal to every NVIDIA
table in fixtures/dispatch wherever those tables agree with each other, so a re-recorded table that moves a choice
moves this one too, or the test names the difference.

Only devices whose name starts with "NVIDIA" get them: another CUDA-like device (the platform's BI-V100 under
CoreX) keeps its knobs until a table of its own is recorded. Only bfloat16 inputs, as the tables were measured.
A path that cannot run (fla-core missing for `fla_chunk`) falls back to the knobs, as a table's row does.
"""
from __future__ import annotations

__all__ = ["NVIDIA_DEFAULT_BLOCKS", "NVIDIA_DEFAULT_DTYPE", "NVIDIA_PREFIX"]

NVIDIA_PREFIX = "NVIDIA"
NVIDIA_DEFAULT_DTYPE = "bfloat16"
# block -> (from, to, path) ranges, as a table file writes them (to None: open above)
NVIDIA_DEFAULT_BLOCKS: dict[str, tuple[tuple[int, int | None, str], ...]] = {
    "moe_experts": ((1, 31, "triton_decode"), (32, None, "triton_grouped")),
    "moe_block": ((1, 64, "triton_fused_block"), (65, None, "composed")),
    "gdn_prefill": ((1, None, "fla_chunk"),),
    "gdn_decode": ((1, None, "fla_recurrent"),),
    "gdn_layer_decode": ((1, None, "triton"),),
    "gdn_conv": ((1, None, "triton"),),
    "gdn_gated_norm": ((1, None, "triton"),),
    "attention_layer_decode": ((1, None, "triton"),),
    "add_rms_norm": ((1, None, "triton"),),
}
