"""A dispatch table holding one block, written from (from, to, path) ranges and named by QWEN36_DISPATCH_TABLE, for
the tests of a block's serving choice; the setting and the table cache are cleared before and after."""
from __future__ import annotations

import contextlib
import json

from model.dispatch.table import SCHEMA, TABLE_ENV, clear_table_cache

__all__ = ["one_block_table"]


@contextlib.contextmanager
def one_block_table(tmp_path, monkeypatch, block: str, keyed_by: str = "batch"):
    """Yields write(ranges, dtype="float32"), which writes the table for the CPU and points the dispatchers at it."""

    def write(ranges, dtype: str = "float32"):
        path = tmp_path / "table.json"
        spec = {"keyed_by": keyed_by, "ranges": [{"from": lo, "to": hi, "path": p} for lo, hi, p in ranges]}
        path.write_text(json.dumps({"schema": SCHEMA, "device": "cpu", "dtype": dtype, "recorded": {},
                                    "blocks": {block: spec}}))
        monkeypatch.setenv(TABLE_ENV, str(path))
        clear_table_cache()

    monkeypatch.delenv(TABLE_ENV, raising=False)
    clear_table_cache()
    try:
        yield write
    finally:
        monkeypatch.delenv(TABLE_ENV, raising=False)
        clear_table_cache()
