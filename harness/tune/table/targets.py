"""The issues' targets at the real per-rank dims, judged from the measurements: met or missed, by how much.

Issue 13 (GDN, under graph): prefill T=16384 <= 1 ms; decode batch 1 <= 20 us; decode batch 256 <= 120 us.
Issue 12 (routed experts, L2 flushed): graph T=1 <= 12 us; graph 2 <= T <= 64 within 2x the HBM/compute
floor; eager T=1 <= 40 us; T=4096 <= 300 us (graph where the path captures, else eager).
Issue 28 (the platform serves eager): MoE block T=1 <= 150 us eager, <= 25 us graph; T=8 <= 50 us graph; GDN
decode layer B=1 <= 150 us eager, <= 25 us graph; B=256 <= 150 us graph; GDN layer prefill T=16384 <= 1.5 ms
graph. A layer's target takes whole-layer rows only (staged or fused), never one stage.
Each target takes the best correct path at that point.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..measure.point import Measurement
from .block_rows import is_layer_row

__all__ = ["Verdict", "judge_targets"]


@dataclass(frozen=True)
class Verdict:
    target: str
    block: str
    limit_us: float
    measured_us: float | None
    path: str | None
    met: bool

    def line(self) -> str:
        if self.measured_us is None:
            return f"{self.target}: not measured"
        word = "met" if self.met else f"MISSED by {self.measured_us - self.limit_us:.1f} us ({self.measured_us / self.limit_us:.2f}x)"
        return f"{self.target} (limit {self.limit_us:.1f} us): {self.measured_us:.1f} us by {self.path}: {word}"


def _best(rows, block, key, mode) -> tuple[float, str] | None:
    found = []
    for r in rows:
        if r.block != block or r.key != key or r.status != "ok":
            continue
        if block.startswith("gdn_layer") and not is_layer_row(block, r.path):
            continue  # one stage of the layer, not the layer
        t = {"graph": r.graph, "eager": r.eager}.get(mode) if mode != "any" else (r.graph or r.eager)
        if t is not None:
            found.append((t.median_us, r.path))
    return min(found) if found else None


def _verdict(rows, name, block, key, mode, limit) -> Verdict:
    best = _best(rows, block, key, mode)
    return Verdict(name, block, limit, best[0] if best else None, best[1] if best else None,
                   bool(best and best[0] <= limit))


def judge_targets(rows: list[Measurement]) -> list[Verdict]:
    out = [
        _verdict(rows, "GDN prefill T=16384, graph", "gdn_prefill", 16384, "graph", 1000.0),
        _verdict(rows, "GDN decode B=1, graph", "gdn_decode", 1, "graph", 20.0),
        _verdict(rows, "GDN decode B=256, graph", "gdn_decode", 256, "graph", 120.0),
        _verdict(rows, "MoE experts T=1, graph", "moe_experts", 1, "graph", 12.0),
        _verdict(rows, "MoE experts T=1, eager", "moe_experts", 1, "eager", 40.0),
        _verdict(rows, "MoE experts T=4096, graph or eager", "moe_experts", 4096, "any", 300.0),
        _verdict(rows, "MoE block T=1, eager", "moe_block", 1, "eager", 150.0),
        _verdict(rows, "MoE block T=1, graph", "moe_block", 1, "graph", 25.0),
        _verdict(rows, "MoE block T=8, graph", "moe_block", 8, "graph", 50.0),
        _verdict(rows, "GDN decode layer B=1, eager", "gdn_layer_decode", 1, "eager", 150.0),
        _verdict(rows, "GDN decode layer B=1, graph", "gdn_layer_decode", 1, "graph", 25.0),
        _verdict(rows, "GDN decode layer B=256, graph", "gdn_layer_decode", 256, "graph", 150.0),
        _verdict(rows, "GDN layer prefill T=16384, graph", "gdn_layer_prefill", 16384, "graph", 1500.0),
    ]
    floors = {r.key: r.floor.us for r in rows if r.block == "moe_experts" and r.floor and r.floor.us}
    for tokens in sorted(k for k in floors if 2 <= k <= 64):
        out.append(_verdict(rows, f"MoE experts T={tokens}, graph, 2x floor", "moe_experts", tokens, "graph",
                            2 * floors[tokens]))
    measured = {r.block for r in rows}
    return [v for v in out if v.block in measured]  # a run of one side judges that side only
