"""What the GPU perf gate times, read from a device's dispatch table: every point where the table dispatches a
path (the path it names there), the whole MoE block and the GDN layer at their recorded points, and, for the
full check, every path at every dispatch point, and every conv and gated-norm path at the GDN points of a table
recorded before those two blocks were dispatched. Numbers only; nothing here needs a device.

The routine gate's points come from one place, `routine_plan` and `routine_points`: `--check` times them and
`--ab` asks its workers for exactly them, so the A/B can never pass a path the check would have timed."""
from __future__ import annotations

from dataclasses import dataclass, field

from model.attention.decode_layer import select_attention_decode_layer_path
from model.gdn import select_conv_path, select_gated_norm_path
from model.moe import MoEConfig, select_block_path, select_expert_path
from model.norm.rms_norm import select_add_rms_norm_path

from ..step.point import STEP_BLOCK, STEP_PATH
from ..table.block_rows import COMPOSED, fused_layer_paths
from ..table.record import RecordedPoint

__all__ = ["CheckPlan", "PATH_BLOCKS", "layer_paths_to_time", "plan_check", "ranking_block", "routine_plan",
           "routine_points", "served_block_row"]

# The dispatch blocks timed path by path at their own points (the full check times the others beside the choice).
PATH_BLOCKS = ("moe_experts", "gdn_prefill", "gdn_decode", "gdn_conv", "gdn_gated_norm", "attention_layer_decode",
               "add_rms_norm")

MOE_BLOCK, LAYER_BLOCKS = "moe_block", ("gdn_layer_decode", "gdn_layer_prefill")
# The blocks added to the table after tables were recorded without them (the staged GDN layer's stages, the
# attention decode layer, the add + RMSNorm), and the path each serves where a table has no entry (no device
# given: the model's default).
STAGE_DEFAULTS = {"gdn_conv": select_conv_path, "gdn_gated_norm": select_gated_norm_path,
                  "attention_layer_decode": select_attention_decode_layer_path,
                  "add_rms_norm": select_add_rms_norm_path}


@dataclass
class CheckPlan:
    """block -> key -> the path names to time there (None: every available path)."""
    moe_experts: dict[int, set[str] | None] = field(default_factory=dict)
    moe_block: dict[int, set[str] | None] = field(default_factory=dict)
    gdn_prefill: dict[int, set[str] | None] = field(default_factory=dict)
    gdn_decode: dict[int, set[str] | None] = field(default_factory=dict)
    gdn_layer_decode: dict[int, set[str] | None] = field(default_factory=dict)  # batch -> decode-layer paths
    gdn_conv: dict[int, set[str] | None] = field(default_factory=dict)  # tokens -> conv paths
    gdn_gated_norm: dict[int, set[str] | None] = field(default_factory=dict)  # rows -> gated-norm paths
    attention_layer_decode: dict[int, set[str] | None] = field(default_factory=dict)  # batch -> attention paths
    add_rms_norm: dict[int, set[str] | None] = field(default_factory=dict)  # rows -> add + RMSNorm paths
    layer_points: list[tuple[int, int]] = field(default_factory=list)  # (batch, tokens)
    step_batches: list[int] = field(default_factory=list)  # the whole decode step, where recorded
    dispatched: dict[tuple[str, int], str] = field(default_factory=dict)  # (block, key) -> the table's path
    # Full check, a table without a stage block: (block, key) -> the path served there without an entry.
    by_default: dict[tuple[str, int], str] = field(default_factory=dict)

    def points(self) -> int:
        return (len(self.moe_experts) + len(self.moe_block) + len(self.gdn_prefill) + len(self.gdn_decode)
                + len(self.gdn_conv) + len(self.gdn_gated_norm) + len(self.attention_layer_decode)
                + len(self.add_rms_norm) + len(self.layer_points) + len(self.step_batches))

    def paths_at(self, block: str):
        """The sweeps' filter for `block`: key -> the names to time (None for every path)."""
        chosen = getattr(self, block)
        return lambda key: chosen.get(key)


def _dispatch_points(raw_table: dict) -> dict[tuple[str, int], str]:
    """(block, point) -> the path the table dispatches there, for every point its ranges were chosen at. A range
    that only takes over above a point (the fastest path there takes fewer tokens) names that point as its
    evidence but does not serve it: only the range holding the point counts."""
    out = {}
    for block, spec in raw_table.get("blocks", {}).items():
        for r in spec.get("ranges", []):
            for evidence in r.get("measured", []):
                at = evidence.get("at")
                if at is not None and r["from"] <= at and (r["to"] is None or at <= r["to"]):
                    out[(block, int(at))] = r["path"]
    return out


def plan_check(raw_table: dict, recorded: dict[tuple[str, int, str], RecordedPoint], full: bool) -> CheckPlan:
    """Routine: the table's own path at each of its dispatch points, the MoE block and GDN layer where recorded.
    Full: every available path at every dispatch point and block point (for the stale-table check) as well."""
    plan = CheckPlan(dispatched=_dispatch_points(raw_table))
    for (block, key), path in plan.dispatched.items():
        getattr(plan, block)[key] = None if full else {path}
        if block == "gdn_layer_decode" and (key, 1) not in plan.layer_points:
            plan.layer_points.append((key, 1))
    for block, key, _ in recorded:
        if block == MOE_BLOCK:
            # Timed as served: the path the dispatcher picks there (the check fills it in on the device).
            plan.moe_block[key] = None if full else set()
        elif block in LAYER_BLOCKS:
            point = (key, 1) if block == "gdn_layer_decode" else (1, key)
            if point not in plan.layer_points:
                plan.layer_points.append(point)
        elif block == STEP_BLOCK and key not in plan.step_batches:
            plan.step_batches.append(key)
    plan.layer_points.sort(key=lambda bt: (bt[1], bt[0]))
    plan.step_batches.sort()
    if full:
        _add_undispatched_stages(plan, raw_table)
    return plan


def _add_undispatched_stages(plan: CheckPlan, raw_table: dict) -> None:
    """A table recorded before a STAGE_DEFAULTS block existed serves that block's default: time every path of the
    block at the GDN points the table has (conv: one token and the prefill token counts; gated norm and add +
    RMSNorm: the prefill token counts and the decode batches, as rows; the attention decode layer: the decode
    batches), so the table is stale where another wins."""
    prefill = {key for block, key in plan.dispatched if block == "gdn_prefill"}
    decode = {key for block, key in plan.dispatched if block == "gdn_decode"}
    wanted = {"gdn_conv": {1} | prefill if prefill else set(), "gdn_gated_norm": prefill | decode,
              "attention_layer_decode": decode, "add_rms_norm": prefill | decode}
    for block, keys in wanted.items():
        if block in raw_table.get("blocks", {}):
            continue
        for key in sorted(keys):
            getattr(plan, block)[key] = None
            plan.by_default[(block, key)] = STAGE_DEFAULTS[block](key)


def layer_paths_to_time(plan: CheckPlan, fused: list[str], full: bool) -> tuple[str, ...]:
    """The whole-layer rows the check times at its layer points: the staged layer (`layer`, as recorded) always;
    the fused decode-layer paths the table names, or all of them in the full check (a table recorded before a
    path existed is stale where that path is faster)."""
    named = set(fused) if full else {p for paths in plan.gdn_layer_decode.values() for p in (paths or ())}
    return ("layer", *sorted(named & set(fused)))


def ranking_block(block: str, key: int, plan: CheckPlan) -> str:
    """Which timings decided the table's choice at a point: the whole block where it was timed (MoE), else the
    block itself (harness/tune/table/build.py ranks the routed experts by the block's time at the block's points)."""
    return MOE_BLOCK if block == "moe_experts" and key in plan.moe_block else block


def served_block_row(tokens: int, device, dtype) -> str:
    """The `moe_block` row that times the block as served at `tokens` (harness/tune/table/block_rows.py): a fused
    block path, or the composed block's row of the experts served there. Ask it while the table under test is
    the dispatchers' (check/device_table.py `dispatching_by`)."""
    path = select_block_path(tokens, device, dtype)
    return select_expert_path(tokens, MoEConfig(), device, dtype) if path == COMPOSED else path


def routine_plan(raw_table: dict, recorded: dict[tuple[str, int, str], RecordedPoint], device, dtype) -> CheckPlan:
    """The routine gate's plan with the MoE block as this device serves it under the table (see
    served_block_row): what `--check` times and `--ab` compares."""
    plan = plan_check(raw_table, recorded, full=False)
    for tokens in plan.moe_block:
        plan.moe_block[tokens] = {served_block_row(tokens, device, dtype)}
    return plan


def routine_points(plan: CheckPlan) -> list[dict]:
    """Every point of a routine plan as {"block", "key", "path"}, one per timed row: the table's path at each
    dispatch point, the GDN layer's whole-layer rows (the staged layer and the fused paths the table serves, at
    the decode points), the MoE block as served, the whole decode step where recorded. `--check`'s report has exactly these rows."""
    points = []
    for block in PATH_BLOCKS:
        for key, paths in sorted(getattr(plan, block).items()):
            if paths is None:
                raise ValueError(f"{block} {key}: a full check's plan times every path; only a routine plan lists")
            points += [{"block": block, "key": key, "path": path} for path in sorted(paths)]
    stages = layer_paths_to_time(plan, fused_layer_paths(), full=False)
    for batch, tokens in plan.layer_points:
        block, key = ("gdn_layer_decode", batch) if tokens == 1 else ("gdn_layer_prefill", tokens)
        points += [{"block": block, "key": key, "path": stage} for stage in (stages if tokens == 1 else stages[:1])]
    points += [{"block": "moe_block", "key": key, "path": path}
               for key, paths in sorted(plan.moe_block.items()) for path in sorted(paths or ())]
    points += [{"block": STEP_BLOCK, "key": batch, "path": STEP_PATH} for batch in plan.step_batches]
    return points
