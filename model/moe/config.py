"""The MoE dispatcher's typed configuration: the only place the original environment knobs are read.

| variable                  | field         | values                 | default    |
|---------------------------|---------------|------------------------|------------|
| MOE_NATIVE                | native        | 1/0 (true/false/on/off)| 1          |
| MOE_DECODE_NATIVE         | decode_native | 1/0                    | 1          |
| ENGINEX_MOE_TINY_IMPL     | tiny_impl     | tokenwise, bmm, triton | tokenwise  |
| ENGINEX_MOE_TINY_MAX      | tiny_max      | integer 0..4096        | 4          |
| ENGINEX_MOE_PREFILL_IMPL  | prefill_impl  | sorted, grouped_mm, triton | sorted |

Defaults are the settled values of the engineering notes (tokenwise, TINY_MAX=4). `MOE_NATIVE=0` routes
every token count to the unoptimised definition (in the vLLM plugin: vLLM's own fused MoE stays in place).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from model.dispatch.env import parse_bool

__all__ = ["MoEConfig", "MoEConfigError", "TINY_IMPLS", "PREFILL_IMPLS"]

# `triton` needs Triton on a GPU (model/moe/expert_paths/triton_paths.py); a dispatch table
# (model/dispatch/table.py) normally picks it there, the knob forces it.
TINY_IMPLS = {"tokenwise": "tiny_tokenwise", "bmm": "tiny_bmm", "triton": "triton_decode"}
PREFILL_IMPLS = {"sorted": "sorted", "grouped_mm": "grouped_mm", "triton": "triton_grouped"}
TINY_MAX_LIMIT = 4096


class MoEConfigError(ValueError):
    """A knob has a value the dispatcher cannot use; the message names the variable and the fix."""


def _parse_bool(name: str, raw: str) -> bool:
    return parse_bool(name, raw, MoEConfigError)  # model/dispatch/env.py: the accepted values, "" refused


def _parse_choice(name: str, raw: str, choices: Mapping[str, str]) -> str:
    value = raw.strip().lower()
    if value not in choices:
        raise MoEConfigError(f"{name}={raw!r} is not one of {', '.join(sorted(choices))}: pick one of those")
    return value


def _parse_tiny_max(name: str, raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise MoEConfigError(f"{name}={raw!r} is not an integer: set a token count such as 4 (0 disables)") from None
    return value


@dataclass(frozen=True)
class MoEConfig:
    native: bool = True
    decode_native: bool = True
    tiny_impl: str = "tokenwise"
    tiny_max: int = 4
    prefill_impl: str = "sorted"

    def __post_init__(self) -> None:
        if self.tiny_impl not in TINY_IMPLS:
            raise MoEConfigError(f"tiny_impl={self.tiny_impl!r} is not one of {', '.join(sorted(TINY_IMPLS))}")
        if self.prefill_impl not in PREFILL_IMPLS:
            raise MoEConfigError(
                f"prefill_impl={self.prefill_impl!r} is not one of {', '.join(sorted(PREFILL_IMPLS))}"
            )
        if not 0 <= self.tiny_max <= TINY_MAX_LIMIT:
            raise MoEConfigError(
                f"ENGINEX_MOE_TINY_MAX={self.tiny_max} is out of range: use 0 (off) to {TINY_MAX_LIMIT}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "MoEConfig":
        env = os.environ if environ is None else environ
        default = cls()
        return cls(
            native=_parse_bool("MOE_NATIVE", env["MOE_NATIVE"]) if "MOE_NATIVE" in env else default.native,
            decode_native=(
                _parse_bool("MOE_DECODE_NATIVE", env["MOE_DECODE_NATIVE"])
                if "MOE_DECODE_NATIVE" in env
                else default.decode_native
            ),
            tiny_impl=(
                _parse_choice("ENGINEX_MOE_TINY_IMPL", env["ENGINEX_MOE_TINY_IMPL"], TINY_IMPLS)
                if "ENGINEX_MOE_TINY_IMPL" in env
                else default.tiny_impl
            ),
            tiny_max=(
                _parse_tiny_max("ENGINEX_MOE_TINY_MAX", env["ENGINEX_MOE_TINY_MAX"])
                if "ENGINEX_MOE_TINY_MAX" in env
                else default.tiny_max
            ),
            prefill_impl=(
                _parse_choice("ENGINEX_MOE_PREFILL_IMPL", env["ENGINEX_MOE_PREFILL_IMPL"], PREFILL_IMPLS)
                if "ENGINEX_MOE_PREFILL_IMPL" in env
                else default.prefill_impl
            ),
        )
