"""The plugin's own operators in the served decode step, counted per block kind at B = 1 and 8: a gate that fails
when a count grows, on every kind of CPU.

The platform runs eager, where each operator costs its host dispatch, so this count is what a launch-bound server
feels per token, and it has no timing noise. The sides are harness.gates.servers' profiled servers: `no-cache` (vLLM's
own layers) and `moe-on` (every substitution: the routed experts, the router, and the served blocks forced to the
model's paths, as the CPU server runs them), and `moe-on-compiled` (the same, compiled: the served blocks run inside
their opaque ops, whose contents count as the eager server's calls do). The compiled server is gated against the
eager one's record: its plugin counts were the same, 231 at B = 1 (24 norm, 129 GDN, 78 MoE), on this project's AVX-512
BF16 machine (AMD EPYC Zen 4, 2026-12-07), so a compiled server that makes one more call than an eager one fails.
harness.serving.step_profile counts vLLM's own torch-profiler trace.

What is gated is `plugin`: the top-level operators the plugin's own code calls (harness.serving.step_profile's
module docstring says how they are told from vLLM's). It does not depend on the CPU, where the step's whole count does:
on this project's AVX-512 BF16 machine the substituted step at B = 1 ran 2430 operators, under the AVX2 emulation
(`make test-avx2`) 2547 (vLLM's torch-linear fallback, its bf16 GDN state), and the plugin's own 231 on both
(2026-12-07). So one recorded count serves every kind CI lands on, and a substitute that gains one operator per layer
fails on each. The whole step's counts of both servers are printed beside, not gated: they move with vLLM's build and
the CPU. At B = 8 the MoE block's count depends on the data (the `sorted` expert path loops over the experts a step
routes to: 104 to 203 plugin operators, one kind to another), so it is recorded as a range and not gated
(DATA_DEPENDENT); at B = 1 every count is exact.

Recorded: fixtures/gates/served-step-launches.json. Re-record after a change that should move a count:
QWEN36_RECORD_SERVED_LAUNCHES=1 with this test (it rewrites the fixture and passes; commit the diff).
"""
from __future__ import annotations

import json
import os

import pytest

from harness.gates.servers import MOE_ON, MOE_ON_COMPILED, NO_CACHE, exclusive, trace_dir_of
from harness.paths import REPO_ROOT
from harness.serving.step_profile import count_growth, profile_decode_steps

pytestmark = [pytest.mark.server, pytest.mark.slow]

FIXTURE = REPO_ROOT / "fixtures" / "gates" / "served-step-launches.json"
RECORD_ENV = "QWEN36_RECORD_SERVED_LAUNCHES"
BATCHES = (1, 8)
# Kinds whose plugin count moves with the routing at a batch size (and so the total): recorded as ranges, not gated.
DATA_DEPENDENT = {"8": ("moe", "total")}


def plugin_counts_to_record(measured: dict, side: str = "substituted") -> dict:
    """`side`'s plugin counts by batch, the data-dependent ones as [fewest, most] ranges."""
    out = {}
    for batch, counts in measured[side].items():
        plugin = dict(counts["plugin"])
        for kind in DATA_DEPENDENT.get(batch, ()):
            value = plugin[kind]
            plugin[kind] = value if isinstance(value, list) else [value, value]
        out[batch] = plugin
    return out


def test_data_dependent_counts_are_recorded_as_ranges_and_not_gated():
    measured = {"substituted": {"1": {"plugin": {"total": 9, "moe": 4}}, "8": {"plugin": {"total": 12, "moe": 7}}}}
    recorded = plugin_counts_to_record(measured)
    assert recorded == {"1": {"total": 9, "moe": 4}, "8": {"total": [12, 12], "moe": [7, 7]}}
    assert count_growth(recorded["8"], {"total": 30, "moe": 25}) == []
    assert count_growth(recorded["1"], {"total": 10, "moe": 5}) == ["total: 9 -> 10 (+1)", "moe: 4 -> 5 (+1)"]


# The substituted server, eager or compiled: one recorded count for both (the module docstring).
SUBSTITUTED = [pytest.param(MOE_ON, id="eager"),
               pytest.param(MOE_ON_COMPILED, id="compiled", marks=pytest.mark.compiled_server)]


@pytest.mark.parametrize("on_name", SUBSTITUTED)
def test_served_decode_step_launches_do_not_grow(compared_servers, on_name):
    measured: dict = {}
    # vLLM's own side once: the eager parametrisation measures it (that it runs none of the plugin's operators).
    sides = {"vllm_own": NO_CACHE, "substituted": on_name} if on_name == MOE_ON else {"substituted": on_name}
    for side, name in sides.items():
        server = compared_servers[name]
        with exclusive(server):
            measured[side] = {str(b): profile_decode_steps(server.base_url, server.model, trace_dir_of(server), b,
                                                           api_key=server.api_key).as_json() for b in BATCHES}
    table = "\n".join(f"  {side:<12} B={b}: {counts}" for side, by_batch in measured.items()
                      for b, counts in by_batch.items())
    print(f"\nserved decode step operators, {on_name} (the whole step's by kind; `plugin`: the plugin's own):\n{table}")
    measured_plugin = plugin_counts_to_record(measured)
    if os.environ.get(RECORD_ENV) == "1":
        if on_name == MOE_ON:  # the compiled server is gated against the eager server's record
            FIXTURE.write_text(json.dumps({"what": json.loads(FIXTURE.read_text())["what"], "plugin": measured_plugin},
                                          indent=2) + "\n")
        return
    recorded = json.loads(FIXTURE.read_text())["plugin"]
    if "vllm_own" in measured:
        own = {b: measured["vllm_own"][b]["plugin"]["total"] for b in map(str, BATCHES)}
        assert set(own.values()) == {0}, f"the server without substitutions ran the plugin's operators: {own}"
    findings = [f"B={b} plugin {finding}" for b in map(str, BATCHES)
                for finding in count_growth(recorded[b], measured_plugin[b])]
    assert not findings, (f"the plugin's code makes more operators per decode step on {on_name} than recorded (a "
                          "launch-bound platform pays each): " + "; ".join(findings)
                          + f". If intended, re-record with {RECORD_ENV}=1.")
