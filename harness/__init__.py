"""The harness library and the `qwen36` command: client, metrics, datasets, runner, server launcher,
tiny model builder."""
from __future__ import annotations

__version__ = "0.1.0"
