"""The plugin's typed settings: the only place the patch set reads its environment.

Each patch declares its switch (an environment variable) and its default in its `PATCH`; the settings read
the switch of every patch in patches/catalog.py, so a new patch needs no line here. A switch takes 1/0 (or
true/false, yes/no, on/off: model/dispatch/env.py, which also says why an empty value is refused); every default is
0, so an unset environment leaves vLLM exactly as installed (a stock server). `qwen36 patches status` prints
each patch with its switch.

`QWEN36_PATCHES` turns patches on together: `all` (every patch of the catalog) or a comma-separated list of
patch names. It changes only the default: a patch's own switch, when set, wins (`QWEN36_PATCHES=all` with
`QWEN36_PATCH_OPENAI_ERRORS=0` is the set without that patch, for bisecting). computility-run.yaml and the
Dockerfile set `all`, so a new patch of the catalog is on in the platform image without a line there, and
presubmit checks every required one is. The embedded test server turns the API patches on by their
switches (harness.serving.launcher.embedded_config, through `api_patch_switches`).

The MoE dispatcher's own knobs (MOE_NATIVE, ENGINEX_MOE_TINY_IMPL, ...) stay in model.moe.MoEConfig; with
MOE_NATIVE=0 the substitution stays off and vLLM's fused MoE runs, as that config documents.

`QWEN36_PATCH_TABLE_LOGGED` is not a setting: the plugin sets it after logging the status table so the
engine processes vLLM spawns (which inherit the environment and load the plugin again) do not repeat it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from model.dispatch.env import env_bool
from model.moe import MoEConfig

from . import catalog
from .core.registry import Patch
from .model_paths.step_slowdown import SlowdownError, SlowdownSource

__all__ = ["TABLE_LOGGED_ENV", "PATCH_SET_ENV", "SERVED_FORCE_ENV", "PatchSettings", "PatchSettingsError", "api_patch_switches",
           "table_already_logged", "mark_table_logged", "clear_table_logged"]

TABLE_LOGGED_ENV = "QWEN36_PATCH_TABLE_LOGGED"
SERVED_FORCE_ENV = "QWEN36_SERVED_BLOCKS_FORCE"
PATCH_SET_ENV = "QWEN36_PATCHES"
ALL_PATCHES = "all"


class PatchSettingsError(ValueError):
    """A patch variable has a value the plugin cannot use; the message names the variable and the fix."""


@dataclass(frozen=True)
class PatchSettings:
    patches: tuple[Patch, ...]  # the patches these settings were read for (what apply_patches applies)
    switches: Mapping[str, bool]  # patch name -> its switch
    moe: MoEConfig = field(default_factory=MoEConfig)  # the dispatcher's knobs, read by their own config
    # Not a patch: the perf gates' test-only slowdown (patches/model_paths/step_slowdown.py); off unless its variables
    # are set.
    step_slowdown: SlowdownSource = field(default_factory=SlowdownSource)
    # The served blocks (patches/model_paths/served_choice.py): the model's path also where the device's table leaves
    # vLLM's own (tests: every seam adapter runs on a CPU server). Not a patch switch: it changes no patch's on/off.
    served_force: bool = False

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
        chosen = patch_set(env, patches)
        switches = {p.name: env_bool(env, p.switch, p.name in chosen or p.default, PatchSettingsError)
                    for p in patches}
        try:
            slowdown = SlowdownSource.from_env(env)
        except SlowdownError as exc:
            raise PatchSettingsError(str(exc)) from None
        force = env_bool(env, SERVED_FORCE_ENV, False, PatchSettingsError)
        return cls(patches, switches, MoEConfig.from_env(env), slowdown, force)


def patch_set(environ: Mapping[str, str], patches: tuple[Patch, ...]) -> set[str]:
    """The names `QWEN36_PATCHES` turns on (empty when it is unset): `all` (every one of `patches`), or a
    comma-separated list of patch names. An empty value or a name that is no patch of `patches` or the catalog
    is refused, naming the known ones."""
    raw = environ.get(PATCH_SET_ENV)
    if raw is None:
        return set()
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if [n.lower() for n in names] == [ALL_PATCHES]:
        return {p.name for p in patches}
    known = list(dict.fromkeys(p.name for p in (*patches, *catalog.PATCHES)))
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        what = f"names no patch {', '.join(map(repr, unknown))}" if unknown else "is empty"
        raise PatchSettingsError(f"{PATCH_SET_ENV}={raw!r} {what}: set it to {ALL_PATCHES} or to a comma-separated "
                                 f"list of {', '.join(known)} (or unset it and use each patch's own switch)")
    return set(names)


def api_patch_switches(patches: tuple[Patch, ...] | None = None) -> dict[str, str]:
    """Patch name -> switch of every patch that mends the API server's requests and answers (kind "api")."""
    return {p.name: p.switch for p in (catalog.PATCHES if patches is None else patches) if p.kind == "api"}


def table_already_logged(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(TABLE_LOGGED_ENV) == "1"


def mark_table_logged() -> None:
    os.environ[TABLE_LOGGED_ENV] = "1"  # inherited by the engine processes vLLM starts after this


def clear_table_logged() -> None:
    os.environ.pop(TABLE_LOGGED_ENV, None)
