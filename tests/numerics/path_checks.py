"""What the path-table properties share: running a property with the cases it always runs, and the skip a path
gets where this CPU cannot run it (naming the file that runs the same property for it instead)."""
from __future__ import annotations

from typing import Callable, Iterator

import pytest
from hypothesis import example, settings

from model.dispatch.paths import ComputePath

__all__ = ["cpu_skip_marks", "path_params", "run_property"]


def run_property(prop: Callable[[], None], examples=(), run_settings: settings | None = None) -> None:
    """Run `prop`, a @given(case=...) property, with each of `examples` as an explicit case and `run_settings`
    (None: the profile's)."""
    for case in examples:
        prop = example(case=case)(prop)
    if run_settings is not None:
        prop = run_settings(prop)
    prop()


def cpu_skip_marks(name: str, path: ComputePath, dtype, tested_elsewhere: dict[str, str],
                   why: str | None = None) -> list:
    """No marks where this CPU runs `path` in `dtype`; else a skip saying why (the path's reason, else `why`) and
    where the path is tested instead."""
    why = path.unavailable_reason("cpu", dtype) or why
    if why is None:
        return []
    return [pytest.mark.skip(reason=f"{name} {dtype}: {why}; tested in {tested_elsewhere.get(name, 'NOWHERE (see the test)')}")]


def path_params(table, dtypes, tested_elsewhere: dict[str, str],
                why: Callable[[object], str | None] = lambda dtype: None) -> Iterator:
    """pytest params (name, dtype) for each dtype of `dtypes` a path of `table` declares; each skipped, with where
    it is tested, where this CPU cannot run it (its own reason, else `why(dtype)`)."""
    for name, path in table.items():
        for dtype in dtypes:
            if dtype in path.dtypes:
                yield pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}",
                                   marks=cpu_skip_marks(name, path, dtype, tested_elsewhere, why(dtype)))
