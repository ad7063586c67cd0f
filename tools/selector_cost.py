"""Per-call host cost of each dispatch selector on this host, outside a scope and answered from a scope's memo."""
import timeit, torch, sys
from model.attention.decode_layer import select_attention_decode_layer_path
from model.dispatch.scope import one_dispatch_scope
from model.gdn.decode_layer import select_decode_layer_path
from model.moe import select_block_path
from model.moe.config import MoEConfig
from model.norm.rms_norm import select_add_rms_norm_path
dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
dt = torch.bfloat16
cfg = MoEConfig()
cases = {
 "gdn decode layer B=1": lambda: select_decode_layer_path(1, dev, dt),
 "attention decode layer B=1": lambda: select_attention_decode_layer_path(1, dev, dt),
 "add_rms_norm rows=1": lambda: select_add_rms_norm_path(1, dev, dt),
 "moe block T=1": lambda: select_block_path(1, dev, dt, cfg),
}
for name, f in cases.items():
    out = min(timeit.repeat(f, number=20000, repeat=5)) / 20000 * 1e6
    with one_dispatch_scope():
        f()
        inn = min(timeit.repeat(f, number=20000, repeat=5)) / 20000 * 1e6
    print(f"{name:30s} outside a scope {out:6.2f} us   from the scope's memo {inn:6.2f} us   answer {f()}")
