"""The name of the server under test: it picks the snapshot directory and the deviations that apply."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from syrupy.extensions.amber import AmberSnapshotExtension

EMBEDDED_TARGET = "tiny-cpu"
# Target-independent snapshots (the rendered chat template). A target name cannot start with "_".
TEMPLATE_SNAPSHOTS = "_template"


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
    """An amber extension writing to __snapshots__/<target>/ so each target keeps its own snapshot set.

    Every snapshot of this suite lives one level down: syrupy's discovery walks its directory recursively
    and deletes files it does not own on --snapshot-update, so nothing may discover __snapshots__/ itself,
    or updating one target would delete the others' snapshots."""

    class TargetSnapshotExtension(AmberSnapshotExtension):
        @classmethod
        def dirname(cls, *, test_location) -> str:
            return str(Path(test_location.filepath).parent / "__snapshots__" / target)

    TargetSnapshotExtension.__name__ = f"TargetSnapshotExtension[{target}]"
    return TargetSnapshotExtension
