"""Which block of the decode step gives different bits on identical eager runs: each block of the per-rank model
(bf16, real dims, B = 8 and 64) run 5 times on the same inputs, on CUDA.

    python3 tools/block_repro_probe.py
"""
import torch, torch.nn.functional as F
from harness.tune.measure.dims import REAL_PER_RANK
from harness.tune.measure.inputs import moe_weights, gdn_weights, attention_weights, rank_config
from harness.tune.step.run import QWEN36_35B_A3B
from model.attention.layer import KVCache, StaticKVCache, gated_attention_static
from model.gdn import GDNState, run_decode_layer
from model.moe import moe_block
from model.qwen36 import Qwen36Config
dev, dt = torch.device("cuda"), torch.bfloat16
g = torch.Generator(device=dev).manual_seed(0)
def same(name, fn, reps=5):
    outs = [fn() for _ in range(reps)]
    outs = [o if isinstance(o, torch.Tensor) else o[0] for o in outs]
    diff = max((a.float() - outs[0].float()).abs().max().item() for a in outs[1:])
    print(f"{name}: {'reproducible' if diff == 0 else f'NOT reproducible, max abs diff {diff:.3g}'}", flush=True)
for B in (8, 64):
    x = torch.randn(B, 2048, generator=g, device=dev).to(dt)
    w = moe_weights(REAL_PER_RANK.moe, dt, dev)
    for block in ("triton_fused_block", "composed"):
        same(f"B={B} moe_block {block}", lambda: moe_block(x, w, block=block))
    for n in (256, 3088, 62080, 8192):
        wt = torch.randn(n, 2048, generator=g, device=dev).to(dt)
        same(f"B={B} linear N={n}", lambda: F.linear(x, wt))
    gw = gdn_weights(REAL_PER_RANK.gdn, dt, dev)
    d = REAL_PER_RANK.gdn
    st = GDNState(conv=torch.randn(B, d.conv_dim, d.conv_kernel - 1, generator=g, device=dev).to(dt),
                  recurrent=torch.randn(B, d.num_v_heads, d.head_k_dim, d.head_v_dim, generator=g, device=dev))
    out = GDNState(conv=torch.empty_like(st.conv), recurrent=torch.empty_like(st.recurrent))
    for path in ("triton", "staged"):
        same(f"B={B} gdn decode layer {path}", lambda: run_decode_layer(path, x[:, None], gw, st, out))
    cfg = rank_config(Qwen36Config.from_hf_dict(QWEN36_35B_A3B), 4)
    aw = attention_weights(cfg.attention_dims, dt, dev)
    ad = cfg.attention_dims
    kv = KVCache(torch.randn(B, ad.num_kv_heads, 256, ad.head_dim, generator=g, device=dev).to(dt),
                 torch.randn(B, ad.num_kv_heads, 256, ad.head_dim, generator=g, device=dev).to(dt))
    length = torch.tensor(256, device=dev)
    sc = StaticKVCache.holding(kv, 259, length)
    same(f"B={B} attention static", lambda: gated_attention_static(x[:, None], aw, sc))
