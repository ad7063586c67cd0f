"""A dispatch table cut to its decode points (MoE T=1, 8; GDN decode B=1, 256), for a short full check:

    python3 tools/table_decode_points.py fixtures/dispatch/nvidia-h200.json /tmp/decode-points.json
    python3 -m harness.tune --check-stale --table /tmp/decode-points.json
"""
import json, sys
src, dst = sys.argv[1], sys.argv[2]
t = json.load(open(src))
keep = {"moe_experts": {1, 8}, "gdn_decode": {1, 256}}
blocks = {}
for b, spec in t["blocks"].items():
    if b not in keep:
        continue
    ranges = []
    for r in spec["ranges"]:
        r = dict(r, measured=[e for e in r.get("measured", []) if e.get("at") in keep[b]])
        ranges.append(r)
    blocks[b] = dict(spec, ranges=ranges)
t["blocks"] = blocks
pts = {"moe_experts": {1, 8}, "gdn_decode": {1, 256}, "moe_block": {1, 8}, "gdn_layer_decode": {1, 256}}
t["timings"]["points"] = [p for p in t["timings"]["points"] if p["key"] in pts.get(p["block"], set())]
json.dump(t, open(dst, "w"), indent=1)
print("kept blocks", list(blocks), "points", len(t["timings"]["points"]))
