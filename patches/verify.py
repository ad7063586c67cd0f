"""`python -m patches.verify`: load the plugin the way vLLM does and fail unless every required patch applied.

The platform image runs this in a RUN step with the run config's environment: a missing seam, a failed
install or a plugin vLLM cannot load stops the build with the table, instead of a server that starts without
its patches. `--json` prints the rows as one JSON line instead of the table.
Exit 0 = every required patch applied; 1 = not; 2 = the plugin is not registered with vLLM.
"""
from __future__ import annotations

import json
import sys

from .core.registry import apply_patches, format_table, missing_required, vllm_version
from .settings import PatchSettings

ENTRY_POINT = ("vllm.general_plugins", "qwen36_patches", "patches.plugin:register")


def entry_point_problem() -> str | None:
    from importlib.metadata import entry_points

    group, name, value = ENTRY_POINT
    found = {ep.name: ep.value for ep in entry_points(group=group)}
    if found.get(name) != value:
        return (f"entry point {group}:{name} = {value} is not installed (found {found or 'none'}); "
                "install this project (pip install .) into the Python that runs vLLM")
    return None


def main(argv: list[str] | None = None) -> int:
    as_json = "--json" in (sys.argv[1:] if argv is None else argv)  # presubmit reads the rows
    problem = entry_point_problem()
    if problem:
        print(f"patches.verify: {problem}", file=sys.stderr)
        return 2
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # vLLM's own loader: calls patches.plugin.register in this process
    statuses = apply_patches(PatchSettings.from_env())  # idempotent: reads back what the loader installed
    if as_json:
        version = vllm_version()
        print(json.dumps([{"name": s.name, "state": s.state.value, "required": s.required, "seam": s.seam,
                           "detail": s.detail, "vllm": version} for s in statuses]))
    else:
        print(format_table(statuses))
    missing = missing_required(statuses)
    for s in missing:
        print(f"patches.verify: required patch {s.name} is {s.state.value}: {s.detail}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
