"""End-to-end logits error of the bf16 decode step against a float64 reference model, per path choice (B=1, 8)."""
import json, sys, torch
from harness.tune.measure.inputs import generator, rank_config, rank_weights
from harness.tune.step.graph import relative_difference
from harness.tune.step.run import QWEN36_35B_A3B, TINY_MODEL
from model.qwen36 import CapturableDecodeStep, Qwen36Config, Qwen36Model, Qwen36Paths
dims = sys.argv[1] if len(sys.argv) > 1 else "real"
out = sys.argv[2] if len(sys.argv) > 2 else "step-error.json"
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
cfg = rank_config(Qwen36Config.from_hf_dict(QWEN36_35B_A3B if dims == "real" else TINY_MODEL), 4)
w = rank_weights(cfg, torch.bfloat16, dev)
ref = Qwen36Model(w.to(torch.float64), Qwen36Paths.reference())
sides = {"old (staged attention, fused add+norm)": Qwen36Paths(attention_decode_layer="staged", add_norm="fused"),
         "new (triton attention, triton add+norm)": Qwen36Paths(attention_decode_layer="triton", add_norm="triton"),
         "served": Qwen36Paths()}
res = {}
for batch in (1, 8):
    prompt = torch.randint(0, cfg.vocab_size, (batch, 64), generator=generator(dev, 5 + batch), device=dev)
    ref_logits, ref_cache = ref.forward(prompt)
    ids = ref_logits[:, -1].argmax(-1, keepdim=True)
    ref_step, _ = ref.forward(ids, ref_cache)
    row = {"prefill_vs_ref": {}, "dynamic_step_vs_ref": {}, "static_step_vs_ref": {}}
    for name, paths in sides.items():
        m = Qwen36Model(w, paths)
        logits, cache = m.forward(prompt)
        row["prefill_vs_ref"][name] = relative_difference(logits[:, -1], ref_logits[:, -1])
        row["dynamic_step_vs_ref"][name] = relative_difference(m.forward(ids, cache)[0], ref_step)
        step = CapturableDecodeStep.from_prefill(m, cache, cache.length + 1)
        row["static_step_vs_ref"][name] = relative_difference(step.run(ids), ref_step)
    res[batch] = row
    print(batch, json.dumps(row, indent=1), flush=True)
json.dump(res, open(out, "w"), indent=1)
