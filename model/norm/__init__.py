"""The RMSNorms of Qwen3.5/3.6 (zero-centred, gated, and the residual add fused with the first): references and
fused paths, one table each (`rms_norm`), and their one-launch Triton kernels (`triton_rms_norm`)."""
