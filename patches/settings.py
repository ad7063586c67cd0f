"""The plugin's typed settings: the only place the patch set reads its environment.

Each patch declares its switch (an environment variable) and its default in its `PATCH`; the settings read
the switch of every patch in patches/catalog.py, so a new patch needs no line here. A switch takes 1/0 (or
true/false, yes/no, on/off: model/env.py, which also says why an empty value is refused); every default is
0, so an unset environment leaves vLLM exactly as installed (a stock server). `qwen36 patches status` prints
each patch with its switch; computility-run.yaml (the platform) and the embedded test server
(harness.server.embedded_config, through `api_patch_switches`) turn them on.

The MoE dispatcher's own knobs (MOE_NATIVE, ENGINEX_MOE_TINY_IMPL, ...) stay in model.moe.MoEConfig; with
MOE_NATIVE=0 the substitution stays off and vLLM's fused MoE runs, as that config documents.

`QWEN36_PATCH_TABLE_LOGGED` is not a setting: the plugin sets it after logging the status table so the
engine processes vLLM spawns (which inherit the environment and load the plugin again) do not repeat it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from model.env import env_bool
from model.moe import MoEConfig

from . import catalog
from .registry import Patch

__all__ = ["TABLE_LOGGED_ENV", "PatchSettings", "PatchSettingsError", "api_patch_switches",
           "table_already_logged", "mark_table_logged"]

TABLE_LOGGED_ENV = "QWEN36_PATCH_TABLE_LOGGED"


class PatchSettingsError(ValueError):
    """A patch variable has a value the plugin cannot use; the message names the variable and the fix."""


@dataclass(frozen=True)
class PatchSettings:
    patches: tuple[Patch, ...]  # the patches these settings were read for (what apply_patches applies)
    switches: Mapping[str, bool]  # patch name -> its switch
    moe: MoEConfig = field(default_factory=MoEConfig)  # the dispatcher's knobs, read by their own config

    def is_on(self, name: str) -> bool:
        if name not in self.switches:
            raise KeyError(f"patch {name} is not one of those these settings were read for "
                           f"({', '.join(self.switches)}): read them with PatchSettings.from_env(env, patches)")
        return self.switches[name]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 patches: tuple[Patch, ...] | None = None) -> "PatchSettings":
        """The switches of `patches` (default: the catalog's) and the MoE knobs from `environ` (default: this
        process's environment)."""
        env = os.environ if environ is None else environ
        patches = catalog.PATCHES if patches is None else tuple(patches)
        switches = {p.name: env_bool(env, p.switch, p.default, PatchSettingsError) for p in patches}
        return cls(patches, switches, MoEConfig.from_env(env))


def api_patch_switches(patches: tuple[Patch, ...] | None = None) -> dict[str, str]:
    """Patch name -> switch of every patch that mends the API server's requests and answers (kind "api")."""
    return {p.name: p.switch for p in (catalog.PATCHES if patches is None else patches) if p.kind == "api"}


def table_already_logged(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(TABLE_LOGGED_ENV) == "1"


def mark_table_logged() -> None:
    os.environ[TABLE_LOGGED_ENV] = "1"  # inherited by the engine processes vLLM starts after this
