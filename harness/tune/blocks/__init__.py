"""The sweeps: every registered path of one block timed and checked at its points.

`moe` (routed experts, the whole MoE block, the routers), `gdn` (the gated delta rule, prefill and decode),
`gdn_layer` (the GDN layer whole and by stage, and the fused decode-layer paths), `gdn_stages` (the staged
layer's conv and gated norm), `attention_and_norm` (the full-attention decode layer and the residual add + RMSNorm).
"""
