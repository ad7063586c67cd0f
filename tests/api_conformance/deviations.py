"""Known deviations (fixtures/api/deviations.yaml) as strict xfail marks for one check of one case."""
from __future__ import annotations

from fnmatch import fnmatchcase
from functools import lru_cache

import pytest
import yaml

from harness.paths import FIXTURES

DEVIATIONS_FILE = FIXTURES / "api" / "deviations.yaml"
CHECKS = {"semantics", "tool_arguments", "stream_text", "stream_usage", "same_prompt", "error_shape", "error_code"}
# A mended deviation is kept for stock targets only (the header of deviations.yaml says why).
STOCK_TARGETS = "*-stock"


@lru_cache(maxsize=1)
def deviations() -> tuple[dict, ...]:
    return check_deviations(yaml.safe_load(DEVIATIONS_FILE.read_text())["deviations"])


def check_deviations(entries: list[dict]) -> tuple[dict, ...]:
    """The entries, once each is valid: a unique id (an xfail reason names it), known checks, and a mended
    deviation kept for stock targets only. Raises ValueError naming the entry."""
    ids = [d["id"] for d in entries]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"{DEVIATIONS_FILE}: deviation ids {repeated} are used by more than one entry; "
                         "give each entry its own id")
    for d in entries:
        unknown = set(d["checks"]) - CHECKS
        if unknown:
            raise ValueError(f"{DEVIATIONS_FILE}: deviation {d['id']} names unknown checks {sorted(unknown)}; "
                             f"the checks are {sorted(CHECKS)}")
        if d.get("mended_by") and not all(p.endswith(STOCK_TARGETS[1:]) for p in d["targets"]):
            raise ValueError(f"{DEVIATIONS_FILE}: deviation {d['id']} is mended by {d['mended_by']} but its "
                             f"targets {d['targets']} include patched targets; use patterns ending in -stock")
    return tuple(entries)


def deviation_for(case_name: str, check: str, target: str) -> dict | None:
    for d in deviations():
        if (check in d["checks"] and any(fnmatchcase(case_name, p) for p in d["cases"])
                and any(fnmatchcase(target, p) for p in d["targets"])):
            return d
    return None


def expect_deviation(request: pytest.FixtureRequest, case_name: str, check: str, target: str) -> None:
    """Mark the running test a strict xfail if a known deviation covers it: XPASS then fails the run."""
    d = deviation_for(case_name, check, target)
    if d is not None:
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=f"[{d['id']}] {d['reason']}"))
