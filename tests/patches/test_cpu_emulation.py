"""harness.machine.emulate_cpu: an AVX2-only CPU on a machine with AVX-512, proven by what vLLM does, not by what the
emulation sets.

- any process under `emulation_env("avx2")` sees torch.cpu's AVX-512, VNNI and AMX checks answer no, and vLLM loads
  its `_C_AVX2` kernel library and keeps its linears' weights (oneDNN cannot build their bf16 matmul) — on this
  machine's own kind a process loads the library its CPU has;
- under `make test-avx2` (this whole session emulated) every process of the compared servers printed the emulation's
  line, and their logs say what vLLM chose for an AVX2 CPU; without it, none did.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from harness.machine.emulate_cpu import EMULATE_ENV, LOG_LINE, SITE_DIR, emulation_env

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the emulation is of an x86 CPU")

ONEDNN_FALLBACK = "Failed to create oneDNN linear, fallback to torch linear"

# What a process reports of its CPU as vLLM's choices read it, and what vLLM chose.
PROBE = """
import json, torch
from harness.machine.emulate_cpu import emulated_kind, kernel_library
answers = {n: bool(getattr(torch.cpu, n)()) for n in ("_is_avx2_supported", "_is_avx512_supported",
                                                       "_is_avx512_bf16_supported", "_is_amx_tile_supported")}
out = {"answers": answers, "emulated": emulated_kind()}
try:
    from vllm.platforms import current_platform
    current_platform.import_kernels()
    out["library"] = kernel_library()
except ImportError:
    out["library"] = None
print(json.dumps(out))
"""


def probe(env: dict[str, str]) -> dict:
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_emulation_env_puts_its_site_first_and_caps_onednn_and_aten():
    env = emulation_env("avx2", {"PYTHONPATH": f"/a{os.pathsep}{SITE_DIR}"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SITE_DIR), "/a"]
    assert env[EMULATE_ENV] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    # Inductor's kernels compiled by a native process computed wrong in an emulated one: a cache of its own
    assert "emulated_avx2" in env["TORCHINDUCTOR_CACHE_DIR"]
    with pytest.raises(ValueError, match="the known ones"):
        emulation_env("avx10")


def test_a_process_under_the_emulation_sees_an_avx2_cpu_and_vllm_loads_its_avx2_kernels():
    plain = {k: v for k, v in os.environ.items() if k != EMULATE_ENV}
    emulated = probe(emulation_env("avx2", plain))
    assert emulated["emulated"] == "avx2"
    assert emulated["answers"] == {"_is_avx2_supported": True, "_is_avx512_supported": False,
                                   "_is_avx512_bf16_supported": False, "_is_amx_tile_supported": False}
    if emulated["library"] is not None:  # vLLM installed
        assert emulated["library"].startswith("_C_AVX2"), emulated
    own = probe(plain)
    assert own["emulated"] is None
    if own["library"] is not None and own["answers"]["_is_avx512_bf16_supported"]:
        assert own["library"].startswith("_C."), own  # this machine's own kind: the AVX-512 BF16 library


@pytest.mark.server
@pytest.mark.slow
def test_every_process_of_the_compared_servers_ran_as_the_cpu_this_session_is(compared_servers):
    from harness.gates.servers import MOE_ON, NO_CACHE

    emulating = os.environ.get(EMULATE_ENV) == "avx2"
    for name in (NO_CACHE, MOE_ON):
        log = Path(compared_servers[name].log_path).read_text(errors="replace")
        pids = {line.split(LOG_LINE, 1)[1].split()[0] for line in log.splitlines() if LOG_LINE in line}
        if emulating:
            # the API server, the engine core and the worker each imported torch under the emulation
            assert len(pids) >= 2, f"{name}: the emulation's line from {len(pids)} process(es) in {log[-2000:]}"
            assert ONEDNN_FALLBACK in log, f"{name}: vLLM's linears did not fall back as on an AVX2 CPU"
        else:
            assert not pids, f"{name}: emulated processes in a session that is not"
