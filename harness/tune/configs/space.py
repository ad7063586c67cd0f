"""The block configs `qwen36 tune moe --sweep-configs` tries for the two Triton expert kernels, per token count.

At every T the candidates are the config the kernel's table gives T now, every other config of that table,
and the search space below, so the sweep always times what serves today next to the alternatives. Under
Triton's CPU interpreter (TRITON_INTERPRET=1) GPU tile shapes mean nothing and run for minutes: the space
is then the interpreter's config and one smaller variant, enough to check the sweep end to end.
Imports triton: load this module only once the Triton paths are known to run here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from model.moe import triton_decode, triton_grouped
from model.moe.triton_decode import DECODE_CONFIGS, DecodeConfig, decode_config
from model.moe.triton_grouped import GROUPED_CONFIGS, GroupedConfig, grouped_config

__all__ = ["TritonKernel", "TRITON_KERNELS", "triton_kernel"]


@dataclass(frozen=True)
class TritonKernel:
    path: str  # its name in model.moe.EXPERT_PATHS (whose tolerance and token limits apply)
    source: str  # the file that holds its config table
    table: str  # the table's name there
    config_type: type
    entries: tuple  # the table itself: ((largest T served, config), ...)
    run: Callable  # run(x, w13, w2, weights, ids, out, config=...) -> out
    registered: Callable[[int], object]  # T -> the config T runs with now (the interpreter's under it)
    space: Callable[[int], list]  # T -> the search space at T
    interpreted: bool  # defined for Triton's CPU interpreter

    @property
    def block(self) -> str:
        """The report block of its measurements."""
        return f"{self.path}_configs"

    def candidates(self, tokens: int) -> list:
        """The registered config first, then the table's other configs, then the space; each once."""
        table = [] if self.interpreted else [c for _, c in self.entries]
        return list(dict.fromkeys([self.registered(tokens), *table, *self.space(tokens)]))


# triton_decode: gate-up row blocks x hidden steps x warps, crossed with down column blocks x warps.
DECODE_SPACE = [
    DecodeConfig(block_i=bi, block_h=bh, warps_gate_up=wg, block_n=bn, warps_down=wd)
    for bi, bh, wg in ((2, 1024, 4), (2, 2048, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 8))
    for bn, wd in ((4, 2), (8, 2), (8, 4), (16, 4), (16, 8))
] + [DecodeConfig()]


def _grouped(block_ms, gate_ups, downs) -> list[GroupedConfig]:
    return [GroupedConfig(block_m=bm, gate_up_n=gn, gate_up_k=gk, gate_up_warps=gw, gate_up_stages=gs,
                          down_n=dn, down_k=dk, down_warps=dw, down_stages=ds)
            for bm in block_ms for gn, gk, gw, gs in gate_ups for dn, dk, dw, ds in downs]


# triton_grouped: below LARGE_T an expert gets few rows, so only small row blocks are worth timing; from
# LARGE_T on, larger row blocks and the tile shapes that matter for them.
LARGE_T = 512
GROUPED_SMALL_T_SPACE = _grouped((16, 32), ((64, 64, 4, 4), (128, 64, 4, 3), (64, 128, 4, 3)),
                                 ((64, 128, 4, 2), (128, 64, 4, 2), (256, 64, 8, 2)))
GROUPED_LARGE_T_SPACE = _grouped(
    (32, 64, 128),
    ((64, 64, 4, 4), (128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 128, 4, 3), (64, 64, 8, 5)),
    ((128, 64, 4, 2), (128, 128, 4, 2), (256, 64, 8, 2), (128, 64, 8, 3), (256, 128, 8, 2)),
) + [GroupedConfig()]

# Under the interpreter: blocks smaller than the tiny dims' (hidden 32, intermediate 16), so loops and masks
# take several steps, and few programs, since each runs as Python.
DECODE_INTERPRETER_SPACE = [replace(triton_decode.INTERPRETER_CONFIG, block_i=8, block_n=16)]
GROUPED_INTERPRETER_SPACE = [replace(triton_grouped.INTERPRETER_CONFIG, gate_up_n=8, down_n=16)]


def _decode_space(tokens: int) -> list[DecodeConfig]:
    return DECODE_INTERPRETER_SPACE if triton_decode.INTERPRETED else DECODE_SPACE


def _grouped_space(tokens: int) -> list[GroupedConfig]:
    if triton_grouped.INTERPRETED:
        return GROUPED_INTERPRETER_SPACE
    return GROUPED_LARGE_T_SPACE if tokens >= LARGE_T else GROUPED_SMALL_T_SPACE


TRITON_KERNELS = (
    TritonKernel("triton_decode", "model/moe/triton_decode.py", "DECODE_CONFIGS", DecodeConfig, DECODE_CONFIGS,
                 triton_decode.experts_triton_decode, decode_config, _decode_space, triton_decode.INTERPRETED),
    TritonKernel("triton_grouped", "model/moe/triton_grouped.py", "GROUPED_CONFIGS", GroupedConfig, GROUPED_CONFIGS,
                 triton_grouped.experts_triton_grouped, grouped_config, _grouped_space, triton_grouped.INTERPRETED),
)


def triton_kernel(path: str) -> TritonKernel:
    return next(k for k in TRITON_KERNELS if k.path == path)
