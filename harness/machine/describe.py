"""`python -m harness.machine.describe`: one line naming this machine, the first thing `make test` prints.

A test log then says what ran it: the CPU (vendor, model name, family and model numbers), the architecture, which
of the instruction sets that choose vLLM CPU's and oneDNN's kernels it has and lacks (speed.KIND_FLAGS: AVX2,
AVX-512, its bf16/fp16 forms, AMX), the kernel's release, and whether QWEN36_EMULATE_CPU makes its processes see
another CPU (harness/machine/emulate_cpu.py). The flags are the CPU's own: under the emulation its instructions are
all still there, only the checks vLLM asks answer no.

Plain stdlib and no torch: the Makefile runs it with the system Python, before the install. Without
/proc/cpuinfo (macOS) it asks sysctl, and says "unknown" for what it cannot find (Windows).
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys

from harness.machine.emulate_cpu import EMULATE_ENV
from harness.machine.speed import KIND_FLAGS, cpu_fields

EMULATIONS = {"avx2": "the avx512/amx checks answer no"}
X86 = {"x86_64", "amd64", "i386", "i686", "x86"}


def _sysctl_fields() -> dict[str, str]:
    """macOS: sysctl's `machdep.cpu.*` under /proc/cpuinfo's names ({} elsewhere, or where sysctl fails)."""
    try:
        out = subprocess.run(["sysctl", "machdep.cpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    raw = cpu_fields(out)  # the same `key: value` lines
    names = {"machdep.cpu.brand_string": "model name", "machdep.cpu.vendor": "vendor_id",
             "machdep.cpu.family": "cpu family", "machdep.cpu.model": "model"}
    fields = {ours: raw[theirs] for theirs, ours in names.items() if raw.get(theirs)}
    # Intel Macs list AVX2 and AVX512F among these (upper case); Apple silicon lists none.
    features = " ".join(raw.get(k, "") for k in ("machdep.cpu.features", "machdep.cpu.leaf7_features")).lower()
    if features.strip():
        fields["flags"] = features
    return fields


def describe(cpuinfo: str | None = None, environ: dict[str, str] | None = None, machine: str | None = None,
             release: str | None = None) -> str:
    """The line; `cpuinfo` (/proc/cpuinfo's text), `environ`, `machine` (the architecture) and `release` (the
    kernel's) default to this machine's."""
    environ = os.environ if environ is None else environ
    machine = machine or platform.machine() or "unknown architecture"
    release = release or platform.release() or "unknown"
    fields = cpu_fields(cpuinfo)
    if not fields and cpuinfo is None and sys.platform == "darwin":
        fields = _sysctl_fields()
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    numbers = ", ".join(f"{label} {fields[key]}" for key, label in (("cpu family", "family"), ("model", "model"))
                        if fields.get(key))
    vendor = ", ".join(filter(None, (fields.get("vendor_id"), numbers))) or "vendor unknown"
    if "flags" in fields:
        flags = set(fields["flags"].split())
        present = [f for f in KIND_FLAGS if f in flags]
        absent = [f for f in KIND_FLAGS if f not in flags]
        sets = f"has {' '.join(present) or 'none'}; lacks {' '.join(absent) or 'none'}"
    elif machine.lower() not in X86:
        sets = f"not x86: none of {' '.join(KIND_FLAGS)}"
    else:
        sets = f"{' '.join(KIND_FLAGS)}: unknown (no CPU flags to read here)"
    line = f"machine: {name} ({vendor}), {machine}, {os.cpu_count() or '?'} CPUs; {sets}; kernel {release}"
    kind = environ.get(EMULATE_ENV)
    if kind:
        line += f"; emulating: {kind} ({EMULATIONS.get(kind, 'not an emulation harness.machine.emulate_cpu knows')})"
    return line


if __name__ == "__main__":
    print(describe(), flush=True)
