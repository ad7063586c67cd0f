"""The name of the server under test: it picks the snapshot directory and the deviations that apply."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from syrupy.extensions.amber import AmberSnapshotExtension

EMBEDDED_TARGET = "tiny-cpu"
# Target-independent snapshots (the rendered chat template). A target name cannot start with "_".
TEMPLATE_SNAPSHOTS = "_template"
SNAPSHOT_ROOT = "snapshots"  # beside the test files; see snapshot_extension


def target_name(server_url: str | None, explicit: str | None) -> str:
    if explicit:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", explicit):
            raise ValueError(f"--target-name {explicit!r}: use letters, digits, '.', '_' and '-' only "
                             "(it names a snapshot directory)")
        return explicit
    if not server_url:
        return EMBEDDED_TARGET
    # http://10.0.0.5:8000/ -> live-10.0.0.5-8000
    host = re.sub(r"^[a-z]+://", "", server_url.strip().rstrip("/"))
    return "live-" + re.sub(r"[^A-Za-z0-9.]+", "-", host).strip("-")


@lru_cache(maxsize=None)
def snapshot_extension(target: str) -> type[AmberSnapshotExtension]:
    """An amber extension writing to snapshots/<target>/ so each target keeps its own snapshot set.

    The root is `snapshots/`, not syrupy's default `__snapshots__/`: syrupy's discovery walks a directory
    recursively and deletes what it does not own on --snapshot-update. An xdist worker that runs no
    snapshot test at all falls back to the default extension and discovers the default `__snapshots__/`
    of every collected test file; when the targets lived there it found the other targets' files, called
    them unused and failed the run (a fresh-clone `make test`, 2026-12-01: "48 snapshots unused", the
    tiny-cpu-stock set). Under `snapshots/` no default discovery reaches them."""

    class TargetSnapshotExtension(AmberSnapshotExtension):
        @classmethod
        def dirname(cls, *, test_location) -> str:
            return str(Path(test_location.filepath).parent / SNAPSHOT_ROOT / target)

    TargetSnapshotExtension.__name__ = f"TargetSnapshotExtension[{target}]"
    return TargetSnapshotExtension
