"""The harness library and the `qwen36` command.

A package per concern (each `__init__` says what it owns and what it may import; the `[tool.importlinter]`
contracts in pyproject.toml check it, top to bottom):
- `cli` (`qwen36`) and `suite_session` (`make test`'s servers): the entry points; they compose the rest.
- `gates`: perf verdicts (paired A/B, recorded profiles, calibration, the reference commit);
  `presubmit`: the go/no-go before the image is pushed; `tune`: the per-device dispatch table. Independent.
- `bench`: the benchmark pipeline, from datasets to a run directory.
- `serving`: the embedded vLLM CPU server's lifecycle; `machine`: what the machine is and does. Independent.
- `errors`, `paths`: shared by all, importing nothing of ours.
"""
from __future__ import annotations

__version__ = "0.1.0"
