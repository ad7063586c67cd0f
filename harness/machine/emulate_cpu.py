"""`python -m harness.machine.emulate_cpu avx2 -- CMD [ARG...]`: run CMD, and every process it starts, as on an
AVX2-only x86 CPU (AMD Zen 3, most Intel laptops), on a machine with AVX-512 or AMX.

Why: vLLM's CPU build takes other paths on such a CPU (another kernel library, its GDN state in bf16 instead of
float32, its linears keeping their weights where oneDNN cannot build a bf16 matmul), and CI lands on both kinds. A
developer on an AVX-512 machine sees here what an AVX2 laptop sees (`make test-avx2`).

How, for every Python process of CMD (the environment is inherited; vLLM's engine core and workers are processes):
- `emulated_site/sitecustomize.py` first on PYTHONPATH: torch.cpu's AVX-512, VNNI and AMX checks answer no, which is
  what vLLM's choices read; each process that imports torch prints one `qwen36 cpu emulation: avx2 in pid N` line;
- ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN (torch's and vLLM's), ATEN_CPU_CAPABILITY=avx2 ATen's own kernels (and
  Inductor's generated ones), and Inductor's kernel cache is the emulation's own (INDUCTOR_CACHE_ENV).
What it cannot do is take instructions away: a kernel that checks the CPU itself (cpuid) still sees AVX-512. The proof
that vLLM followed is what it did (`kernel_library()`, the weights its linears kept, the state dtype, the log lines).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["EMULATE_ENV", "KINDS", "SITE_DIR", "emulation_env", "emulated_kind", "kernel_library", "main"]

EMULATE_ENV = "QWEN36_EMULATE_CPU"
SITE_DIR = Path(__file__).resolve().parent / "emulated_site"
KINDS = {"avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}}
# How each emulated process's line begins (sitecustomize.py prints it): tests look for it in a server's log.
LOG_LINE = "qwen36 cpu emulation: avx2 in pid"
# Inductor's compiled kernels are cached per machine, keyed by what it reads of the CPU itself, not by the answers
# the emulation changes: an emulated process that found a native process's kernels in the shared cache computed vLLM's
# compiled GDN layout helper wrong (values unequal to eager, some not finite, 2026-12-07). So the emulated processes
# keep a cache of their own.
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def _inductor_cache(kind: str) -> str:
    import getpass
    import tempfile

    return str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}_emulated_{kind}")


def emulation_env(kind: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) with `kind`'s emulation switched on."""
    if kind not in KINDS:
        raise ValueError(f"no CPU emulation {kind!r}; the known ones: {sorted(KINDS)}")
    env = dict(os.environ if environ is None else environ)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE_DIR)]
    env.update(KINDS[kind], **{EMULATE_ENV: kind, "PYTHONPATH": os.pathsep.join([str(SITE_DIR), *path]),
                               INDUCTOR_CACHE_ENV: _inductor_cache(kind)})
    return env


def emulated_kind() -> str | None:
    """The kind this process emulates (None: the machine's own), as its torch.cpu says."""
    import torch

    return getattr(torch.cpu, "_qwen36_emulated", None)


def kernel_library() -> str | None:
    """The file name of vLLM's CPU kernel library this process loaded (`_C.abi3.so`, `_C_AVX512...` or
    `_C_AVX2...`), from the process's memory map; None before vLLM loads one, or where there is no /proc."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    names = {line.rsplit("/", 1)[-1] for line in maps.splitlines() if "/vllm/_C" in line}
    return sorted(names)[0] if names else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = f"usage: python -m harness.machine.emulate_cpu {{{','.join(KINDS)}}} -- CMD [ARG...]"
    if len(argv) < 3 or argv[1] != "--" or argv[0] not in KINDS:
        print(usage, file=sys.stderr)
        return 2
    env = emulation_env(argv[0])
    print(f"emulate_cpu: {argv[0]} for `{' '.join(argv[2:])}` (torch.cpu's AVX-512/VNNI/AMX checks answer no; "
          f"{', '.join(f'{k}={v}' for k, v in KINDS[argv[0]].items())})", file=sys.stderr, flush=True)
    os.execvpe(argv[2], argv[2:], env)


if __name__ == "__main__":
    sys.exit(main())
