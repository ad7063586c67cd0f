"""What kind of machine this is and how fast it runs small eager PyTorch work right now: what lets a committed
CPU baseline be compared with a run made on another day, and refused for another kind of machine.

The 2-core CI VMs drift: the same VM served decode-micro at 94-110 tok/s one morning and 58-62 the next
day (docs/perf-gates.md, "drift"), while a 20% tolerance is what the gate can afford. A baseline recorded on
one of those days cannot tell a slower commit from a slower day. So runs against a server on this machine
measure this probe before and after their workloads, the baseline records it, and the gate rescales the
baseline's speed metrics by the ratio (harness.gates.gate). The probe is work nobody here wrote and no
commit changes (torch's eager ops at the tiny model's scale, one thread on each core in turn), so a slower
commit slows the server and not the probe.

A scale factor holds between days of one kind of machine, not between kinds: on 2026-12-03 a VM of another
kernel build served the tiny model's decode 4.4 times and its official-like prefill 17 times as fast as the
2026-12-02 recording's VM. So the probe also names the machine's kind (`machine`: CPU count, model, the
vector and matrix extensions that choose vLLM CPU's kernels, the kernel), and a gate refuses a baseline of
another kind.

    python -m harness.machine.speed     # prints one JSON line: the rate and its spread
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Its name goes into baselines and runs: a changed workload is a new name, so old and new never compare.
PROBE = "eager-torch-decode-v1"
# Beyond this factor between a run's probe and its baseline's, on one kind of machine, something other than a
# day's drift is measured (the largest seen between days of one kind: 1.8x): the gate refuses to compare.
MAX_FACTOR = 5.0
CORES_PROBED = 4  # the machine's first cores; more adds time, not information
REPEATS = 5
REPEAT_S = 0.15
# Other processes' CPU use (in cores) beyond which a probe does not stand for the server's speed. The probe is
# busy all the time, the tiny server mostly waits between short steps: with a busy process on each core the
# probe read x0.49 while the session server's decode did not change (286 vs 287 tok/s, 2026-12-03), and a
# rescaled gate then missed the slower decode. Idle, the three servers of `make test` take ~0.05 of a core.
BUSY_LIMIT = 0.25
# vLLM's CPU engine core and worker busy-wait for up to a second after their last message (harness.serving.placement):
# a probe taken sooner after a server's last request would measure that spin, not the machine.
SETTLE_S = 1.5

HIDDEN, INTERMEDIATE, LAYERS, TOKENS = 256, 512, 8, 2  # the tiny model's scale, two sequences per step


# The CPU flags that choose what vLLM CPU and oneDNN run (AMX tiles, bf16/fp16 vector instructions, AVX-512).
KIND_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


@dataclass(frozen=True)
class MachineSpeed:
    probe: str
    rate: float  # probe steps per second, the mean over the probed cores of each core's median repeat
    spread: float  # (max - min) / median over every repeat on every core
    cores: tuple[int, ...]
    machine: str = ""  # machine_kind(): runs compare only on the same kind
    # CPU time other processes took while the probe ran, in cores: above BUSY_LIMIT the probe measured them
    other_busy_cores: float = 0.0

    @property
    def busy(self) -> bool:
        return self.other_busy_cores > BUSY_LIMIT

    def as_dict(self) -> dict:
        return {**asdict(self), "cores": list(self.cores), "unit": "steps/s"}

    @classmethod
    def from_dict(cls, data: dict) -> "MachineSpeed":
        """What as_dict wrote (the probe's JSON line)."""
        return cls(data["probe"], data["rate"], data["spread"], tuple(data["cores"]), data["machine"],
                   data["other_busy_cores"])


def cpu_fields(cpuinfo: str | None = None) -> dict[str, str]:
    """/proc/cpuinfo's fields of the first CPU (`vendor_id`, `cpu family`, `model`, `model name`, `flags`...), from
    `cpuinfo` or the file; {} where there is none (macOS, Windows)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def machine_kind(cpuinfo: str | None = None, amx_usable: bool | None = None) -> str:
    """The kind of machine, for comparing baselines: architecture, CPU count, CPU vendor, family and model, the
    KIND_FLAGS it has, whether torch can use AMX here (the kernel must allow it; vLLM CPU asks torch), and the
    kernel's release. The kernel is there because a VM's CPU model and flags can be a template that hides the
    host: the one change of kind seen so far (2026-12-03: 4.4x decode, 17x prefill) came with a new kernel build
    (fc-v1045 -> fc-v1147); a kernel update then costs a re-recording, never a wrong comparison."""
    import platform

    fields = cpu_fields(cpuinfo)
    flags = set(fields.get("flags", "").split())
    if amx_usable is None:
        import torch

        amx_usable = bool(torch.cpu._is_amx_tile_supported())
    cpu = " ".join(fields.get(k, "?") for k in ("vendor_id", "cpu family", "model"))
    return (f"{platform.machine()}, {os.cpu_count()} CPUs, {cpu}, "
            f"{' '.join(f for f in KIND_FLAGS if f in flags) or 'no vector extensions listed'}, "
            f"AMX {'usable' if amx_usable else 'not usable'}, kernel {platform.release()}")


def _step(x, weights):
    import torch

    for w_up, w_down in weights:
        h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
        gate, up = (h @ w_up).chunk(2, dim=-1)
        x = x + (torch.nn.functional.silu(gate) * up) @ w_down
    return x


def _rates_on_this_core() -> list[float]:
    import torch

    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(HIDDEN, 2 * INTERMEDIATE, generator=gen).bfloat16() * 0.05,
                torch.randn(INTERMEDIATE, HIDDEN, generator=gen).bfloat16() * 0.05) for _ in range(LAYERS)]
    x = torch.randn(TOKENS, HIDDEN, generator=gen).bfloat16()
    with torch.inference_mode():
        for _ in range(20):
            _step(x, weights)
        rates = []
        for _ in range(REPEATS):
            steps, start = 0, time.perf_counter()
            while time.perf_counter() - start < REPEAT_S:
                _step(x, weights)
                steps += 1
            rates.append(steps / (time.perf_counter() - start))
    return rates


def _busy_cpu_seconds() -> float | None:
    """The machine's busy CPU time since boot (/proc/stat's first line: user, nice, system, irq, softirq; idle,
    iowait and the host's steal are not busy here), or None where there is no /proc/stat."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    import resource  # not on Windows, where harness.machine.describe imports this module too

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _machine_cores() -> tuple[int, ...]:
    """The machine's first CORES_PROBED cores, whatever the caller was pinned to (a client pinned to one core
    still probes what the baseline probed); those this process may use where a cpuset forbids the rest."""
    online = set(range(os.cpu_count() or 1))
    try:
        os.sched_setaffinity(0, online)
    except OSError:
        pass
    return tuple(sorted(os.sched_getaffinity(0)))[:CORES_PROBED]


def _probe_here(cores: tuple[int, ...] | None = None) -> MachineSpeed:
    """In this process: one thread, pinned to each core in turn (default: the machine's); and what other
    processes used meanwhile."""
    import torch

    torch.set_num_threads(1)
    cores = cores or _machine_cores()
    per_core, every = [], []
    busy0, own0, wall0 = _busy_cpu_seconds(), _own_cpu_seconds(), time.perf_counter()
    for core in cores:
        os.sched_setaffinity(0, {core})
        rates = _rates_on_this_core()
        per_core.append(statistics.median(rates))
        every += rates
    busy1, own1, wall = _busy_cpu_seconds(), _own_cpu_seconds(), time.perf_counter() - wall0
    others = 0.0 if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
    return MachineSpeed(PROBE, statistics.fmean(per_core), (max(every) - min(every)) / statistics.median(every),
                        cores, machine_kind(), round(others, 3))


def measure_machine_speed(timeout_s: float = 120.0, settle_s: float = SETTLE_S) -> MachineSpeed:
    """The probe in a child process (the caller's affinity and threads stay as they are), `settle_s` after
    the caller's last request."""
    time.sleep(settle_s)
    out = subprocess.run([sys.executable, "-m", "harness.machine.speed"], capture_output=True, text=True,
                         timeout=timeout_s, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return MachineSpeed.from_dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_speed(before: MachineSpeed, after: MachineSpeed) -> dict:
    """A run's record: the probe before and after its workloads, and their mean as the run's rate."""
    return {"probe": before.probe, "unit": "steps/s", "rate": (before.rate + after.rate) / 2,
            "machine": before.machine, "busy": before.busy or after.busy,
            "before": before.as_dict(), "after": after.as_dict()}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Probe this machine's speed; prints one JSON line.")
    parser.add_argument("--cores", default=None, help="comma-separated cores to probe (default: the machine's first "
                                                       f"{CORES_PROBED})")
    args = parser.parse_args()
    chosen = tuple(int(c) for c in args.cores.split(",")) if args.cores else None
    print(json.dumps(_probe_here(chosen).as_dict()))
