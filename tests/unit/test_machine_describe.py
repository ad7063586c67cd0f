"""The line `make test` starts with (harness.machine.describe): the CPU, what it has and lacks of the instruction
sets that choose vLLM CPU's kernels, the kernel, and the CPU emulation when one is on."""
from __future__ import annotations

import subprocess
import sys

from harness.machine.describe import describe

AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 33
model name\t: AMD Ryzen 7 5800X 8-Core Processor
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2
processor\t: 1
vendor_id\t: AuthenticAMD
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2 avx512f amx_tile
"""
SAPPHIRE_RAPIDS = """vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu avx avx2 avx512f avx512bw avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
"""


def _sets(line: str) -> tuple[set[str], set[str]]:
    has = line.split("has ", 1)[1].split(";", 1)[0].split()
    lacks = line.split("lacks ", 1)[1].split(";", 1)[0].split()
    return set(has), set(lacks)


def test_an_avx2_only_cpu_is_named_with_avx512_and_amx_absent():
    line = describe(AVX2_ONLY, environ={}, machine="x86_64", release="6.8.0-test")
    assert line.startswith("machine: AMD Ryzen 7 5800X 8-Core Processor (AuthenticAMD, family 25, model 33), x86_64,")
    has, lacks = _sets(line)
    assert has == {"avx2"}  # the first CPU's flags, not another processor's
    assert {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"} <= lacks
    assert line.endswith("kernel 6.8.0-test")
    assert "emulating" not in line
    assert "\n" not in line


def test_an_amx_cpu_is_named_with_amx_present():
    line = describe(SAPPHIRE_RAPIDS, environ={}, machine="x86_64", release="6.1.0")
    has, lacks = _sets(line)
    assert {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"} <= has
    assert "lacks none" in line and not lacks - {"none"}
    assert "GenuineIntel, family 6, model 143" in line


def test_the_avx2_emulation_is_said_beside_the_cpus_own_flags():
    line = describe(SAPPHIRE_RAPIDS, environ={"QWEN36_EMULATE_CPU": "avx2"}, machine="x86_64", release="6.1.0")
    assert line.endswith("; emulating: avx2 (the avx512/amx checks answer no)")
    assert "amx_tile" in _sets(line)[0]  # the CPU still has them; only the checks vLLM asks answer no


def test_without_cpuinfo_it_says_what_it_does_not_know():
    assert "unknown (no CPU flags to read here)" in describe("", environ={}, machine="AMD64", release="10")
    assert "not x86" in describe("", environ={}, machine="arm64", release="23.1.0")


def test_it_runs_without_torch():
    code = ("import sys, runpy; runpy.run_module('harness.machine.describe', run_name='__main__'); "
            "assert 'torch' not in sys.modules, 'describe imported torch'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("machine: ") and out.stdout.count("\n") == 1
