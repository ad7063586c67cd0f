"""The plugin's typed settings: the only place the patch set reads its environment.

| variable               | field        | values          | default | meaning                                      |
|------------------------|--------------|-----------------|---------|----------------------------------------------|
| QWEN36_PATCH_MOE       | moe_experts  | 1/0 (on/off...) | 0       | routed experts of Qwen3-Next / Qwen3.5 MoE   |
|                        |              |                 |         | layers computed by model.moe.dispatch_experts|

The MoE dispatcher's own knobs (MOE_NATIVE, ENGINEX_MOE_TINY_IMPL, ...) stay in model.moe.MoEConfig; with
MOE_NATIVE=0 the substitution stays off and vLLM's fused MoE runs, as that config documents.

`QWEN36_PATCH_TABLE_LOGGED` is not a setting: the plugin sets it after logging the status table so the
engine processes vLLM spawns (which inherit the environment and load the plugin again) do not repeat it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from model.moe import MoEConfig

__all__ = ["MOE_ENV", "TABLE_LOGGED_ENV", "PatchSettings", "PatchSettingsError"]

MOE_ENV = "QWEN36_PATCH_MOE"
TABLE_LOGGED_ENV = "QWEN36_PATCH_TABLE_LOGGED"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class PatchSettingsError(ValueError):
    """A patch variable has a value the plugin cannot use; the message names the variable and the fix."""


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise PatchSettingsError(f"{name}={raw!r} is not a boolean: set it to 1 (on) or 0 (off)")


@dataclass(frozen=True)
class PatchSettings:
    moe_experts: bool = False  # opt-in: off leaves vLLM exactly as installed
    moe: MoEConfig = field(default_factory=MoEConfig)  # the dispatcher's knobs, read by their own config

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "PatchSettings":
        env = os.environ if environ is None else environ
        return cls(moe_experts=_parse_bool(MOE_ENV, env.get(MOE_ENV, "0")), moe=MoEConfig.from_env(env))


def table_already_logged(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(TABLE_LOGGED_ENV) == "1"


def mark_table_logged() -> None:
    os.environ[TABLE_LOGGED_ENV] = "1"  # inherited by the engine processes vLLM starts after this
