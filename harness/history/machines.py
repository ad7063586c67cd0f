"""The machine a history record was measured on, named coarsely enough to be one line of a plot.

A kind holds what decides the speed of the harness's work (the CPU's vendor, family and model, and the widest
vector or matrix extension vLLM CPU and oneDNN choose their kernels by; the GPU's name; a remote server's hardware)
and nothing that changes without changing the speed (kernel release, host name, CPU count on a VM of one kind),
which goes into `Machine.detail`. harness.machine.speed.machine_kind() is finer: a gate refuses a baseline of
another kernel build, while a plot keeps one line per CPU and says the kernel in the detail.

Plain stdlib: no torch, so a record can be made on a machine without it.
"""
from __future__ import annotations

import os
import platform
from urllib.parse import urlparse

from harness.history.record import Machine
from harness.machine.emulate_cpu import EMULATE_ENV
from harness.machine.speed import KIND_FLAGS, cpu_fields

__all__ = ["cpu_kind", "cpu_machine", "gpu_kind", "device_machine", "machine_from_kind_text", "server_machine",
           "NOT_RECORDED"]

# What a CPU kind says when the run named no CPU (the earliest baselines recorded the architecture only).
NOT_RECORDED = "cpu: model not recorded"
# The names the tuner gives a device that is not a GPU (torch's device type, or platform.processor()).
CPU_DEVICE_NAMES = {"cpu", "x86_64", "amd64", "i386", "i686", "x86", "aarch64", "arm64", "arm", "ppc64le", "s390x"}


def _level(flags: set[str]) -> str:
    """The widest extension that chooses kernels: AMX tiles > AVX-512 (F) > AVX2."""
    if "amx_tile" in flags:
        return "amx"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "no avx2"


def _cpu_line(vendor: str, family: str, model: str, flags: set[str]) -> str:
    return f"cpu: {vendor} family {family} model {model}, {_level(flags)}"


def cpu_kind(cpuinfo: str | None = None, environ=None) -> str:
    """This machine's CPU kind (or `cpuinfo`'s), e.g. "cpu: AuthenticAMD family 25 model 17, avx512";
    " (emulated avx2)" where QWEN36_EMULATE_CPU makes the harness's processes see a smaller CPU."""
    environ = os.environ if environ is None else environ
    fields = cpu_fields(cpuinfo)
    flags = set(fields.get("flags", "").split())
    if fields.get("vendor_id") or fields.get("cpu family"):
        line = _cpu_line(fields.get("vendor_id", "?"), fields.get("cpu family", "?"), fields.get("model", "?"), flags)
    else:  # no /proc/cpuinfo (macOS, Windows) or an ARM one without these fields
        name = fields.get("model name") or fields.get("CPU part") or platform.machine() or "unknown"
        line = f"cpu: {name}" + (f", {_level(flags)}" if flags else "")
    emulated = environ.get(EMULATE_ENV, "")
    return f"{line} (emulated {emulated})" if emulated else line


def cpu_machine(cpuinfo: str | None = None, environ=None) -> Machine:
    """cpu_kind() with the detail: the model name, every KIND_FLAG present, the CPU count and the kernel."""
    fields = cpu_fields(cpuinfo)
    flags = set(fields.get("flags", "").split())
    detail = ", ".join(filter(None, (fields.get("model name"), " ".join(f for f in KIND_FLAGS if f in flags),
                                     f"{os.cpu_count()} CPUs", f"kernel {platform.release()}")))
    return Machine(cpu_kind(cpuinfo, environ), detail)


def gpu_kind(device_name: str) -> str:
    """"NVIDIA H200" -> "gpu: NVIDIA H200": the name torch gives the device, as its dispatch table is named."""
    return f"gpu: {device_name.strip()}"


def device_machine(device_name: str | None, detail: str = "") -> Machine:
    """The machine a `qwen36 tune` run names by its device: a GPU by its name; a CPU run (device "cpu", or the
    architecture `device_identity` gives there) by this machine's CPU, the run having been made here."""
    name = (device_name or "").strip()
    if not name or name.lower() in CPU_DEVICE_NAMES:
        cpu = cpu_machine()
        return Machine(cpu.kind, ", ".join(filter(None, (detail, f"CPU named at `history add`: {cpu.detail}"))))
    return Machine(gpu_kind(name), detail)


def machine_from_kind_text(text: str) -> Machine:
    """A machine from harness.machine.speed.machine_kind()'s line, as baselines and calibrations keep it
    ("x86_64, 2 CPUs, AuthenticAMD 25 1, avx2, AMX not usable, kernel 6.18.44-fc-v1252"): the kind from its CPU
    and flags, the whole line as the detail. A line without the CPU's numbers gives NOT_RECORDED."""
    text = " ".join(text.split())
    parts = [p.strip() for p in text.split(",")]
    if len(parts) >= 4:
        cpu, flags = parts[2].split(), set(parts[3].split())
        if len(cpu) == 3 and not cpu[1].isalpha():
            return Machine(_cpu_line(cpu[0], cpu[1], cpu[2], flags), text)
    return Machine(NOT_RECORDED, text)


def server_machine(base_url: str, hardware: str | None = None) -> Machine:
    """A server reached by URL from another machine: its recorded hardware where a profile names it, else its
    host:port (what a client can see)."""
    if hardware:
        return Machine(f"server: {' '.join(hardware.split())}", base_url or hardware)
    where = urlparse(base_url)
    return Machine(f"server: {where.netloc or base_url}", base_url)
