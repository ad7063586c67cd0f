"""This device's dispatch table as the GPU perf gate (`--check`) and the A/B (`--ab`) read it: which device,
which file, its recorded timings, and whether graph replay is to be timed. A table that cannot be used is
refused with the command that records one."""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from model.dispatch.table import (
    CHECKOUT_TABLE_DIR, TABLE_ENV, DispatchTableError, clear_table_cache, load_dispatch_table, table_file_name,
)

from ..measure.timing import graphs_supported
from ..table.record import RecordedPoint, recorded_points

__all__ = ["RECORD_COMMAND", "TableRefused", "DeviceTable", "dispatching_by", "open_device_table"]

RECORD_COMMAND = "qwen36 tune  (or on the serving image: python3 -m harness.tune)"


class TableRefused(Exception):
    """No usable table: the message names the problem and the command that fixes it."""


@dataclass(frozen=True)
class DeviceTable:
    device: torch.device
    name: str  # the device's name, as the table's file name is made from it
    path: Path
    raw: dict
    recorded: dict[tuple[str, int, str], RecordedPoint]

    @property
    def stem(self) -> str:
        return table_file_name(self.name).removesuffix(".json")

    def times_graphs(self, no_graph: bool) -> bool:
        """Graph replay only where the record has graph times (or there is no record to say): a table recorded
        with --no-graph (the BI-V100's, where capture is not what serves) is checked without capturing."""
        recorded_graphs = not self.recorded or any(p.graph_runs for p in self.recorded.values())
        return graphs_supported(self.device) and not no_graph and recorded_graphs


def open_device_table(device: str | None, table: Path | None) -> DeviceTable:
    """The device asked for (default: cuda when there is one) and its table (default: the checkout's)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
    path = Path(table or (CHECKOUT_TABLE_DIR / table_file_name(name)))
    if not path.is_file():
        raise TableRefused(f"no dispatch table for {name}: {path} does not exist. Record one on this device with "
                           f"`{RECORD_COMMAND}` (it writes fixtures/dispatch/{table_file_name(name)}; on a CPU: "
                           "`qwen36 tune --device cpu --dims tiny --report-dir D`, then pass --table D/cpu.json), "
                           "commit it, then run again")
    try:
        load_dispatch_table(path)
    except DispatchTableError as exc:
        raise TableRefused(str(exc)) from None
    raw = json.loads(path.read_text())
    return DeviceTable(dev, name, path, raw, recorded_points(raw.get("timings")))


@contextlib.contextmanager
def dispatching_by(path):
    """The table under test for this process's dispatchers while open; the caller's setting after."""
    before = os.environ.get(TABLE_ENV)
    os.environ[TABLE_ENV] = str(path)
    clear_table_cache()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TABLE_ENV, None)
        else:
            os.environ[TABLE_ENV] = before
        clear_table_cache()
