"""The served decode step's operators, counted, per block kind, at B = 1 and 8: a gate that fails when a count grows.

The platform runs eager, where each operator costs its host dispatch, so this count is what a launch-bound server
feels per token, and it has no timing noise. Both sides are harness.gates.servers' profiled pair: `no-cache` (vLLM's
own layers) and `moe-on` (every substitution: the routed experts, the router, and the served blocks forced to the
model's paths, as the CPU server runs them). harness.serving.step_profile counts vLLM's own torch-profiler trace.

Recorded counts: fixtures/gates/served-step-launches.json, per CPU kind (the CPU paths differ by what the CPU has:
vLLM packs its GDN conv weights for a C++ kernel only with AVX-512 BF16, for example). A kind recorded as a range
moves with the data (the CPU MoE dispatcher's `sorted` path at B = 8 loops over the experts a step routes to) and is
shown, not gated. Re-record after a change that should move a count: QWEN36_RECORD_SERVED_LAUNCHES=1 with this
test (it rewrites this CPU kind's entry and passes; commit the diff).
"""
from __future__ import annotations

import json
import os
import platform

import pytest
import torch

from harness.gates.servers import MOE_ON, NO_CACHE, exclusive, trace_dir_of
from harness.paths import REPO_ROOT
from harness.serving.step_profile import count_growth, profile_decode_steps

pytestmark = [pytest.mark.server, pytest.mark.slow]

FIXTURE = REPO_ROOT / "fixtures" / "gates" / "served-step-launches.json"
RECORD_ENV = "QWEN36_RECORD_SERVED_LAUNCHES"
BATCHES = (1, 8)
SIDES = {"vllm_own": NO_CACHE, "substituted": MOE_ON}


def cpu_kind() -> str:
    """What decides vLLM's CPU paths: the ISA extensions its kernels dispatch on."""
    flags = [name for name, on in (("avx512_bf16", torch.cpu._is_avx512_bf16_supported()),
                                   ("amx", torch.cpu._is_amx_tile_supported())) if on]
    return f"{platform.machine()}+{'+'.join(flags) or 'no-bf16-isa'}"


def test_the_cpu_kind_names_its_isa():
    assert cpu_kind().startswith(platform.machine())


def test_served_decode_step_launches_do_not_grow(compared_servers):
    measured: dict = {}
    for side, name in SIDES.items():
        server = compared_servers[name]
        with exclusive(server):
            measured[side] = {str(b): profile_decode_steps(server.base_url, server.model, trace_dir_of(server), b,
                                                           api_key=server.api_key).as_json() for b in BATCHES}
    table = "\n".join(f"  {side:<12} B={b}: {counts}" for side, by_batch in measured.items()
                      for b, counts in by_batch.items())
    print(f"\nserved decode step operators on {cpu_kind()}:\n{table}")
    recorded = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {"kinds": {}}
    if os.environ.get(RECORD_ENV) == "1":
        recorded["kinds"][cpu_kind()] = measured
        FIXTURE.write_text(json.dumps(recorded, indent=2) + "\n")
        return
    baseline = recorded["kinds"].get(cpu_kind())
    if baseline is None:
        pytest.skip(f"no recorded count for this CPU kind ({cpu_kind()}; recorded: {sorted(recorded['kinds'])}): "
                    f"record it with {RECORD_ENV}=1 and commit {FIXTURE.relative_to(REPO_ROOT)}")
    findings = [f"{side} B={b}: {finding}" for side in SIDES for b in map(str, BATCHES)
                for finding in count_growth(baseline[side][b], measured[side][b])]
    assert not findings, ("the served decode step makes more operators than recorded (a launch-bound platform pays "
                          "each): " + "; ".join(findings) + f". If intended, re-record with {RECORD_ENV}=1.")
