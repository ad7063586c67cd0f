"""The serving patch set (imports `model`), one room per concern, top layer first (import-linter contract
`patches` in pyproject.toml):
- the plugin: `plugin` (vLLM's entry point, `patches.plugin:register`), `verify` (`python -m patches.verify`, the
  image's build check), `settings` (the one reader of the patches' switches), `catalog` (every patch, in order);
- `api/`: the API patches, and request compatibility helpers for callers without vLLM's server;
- `model_paths/`: the served model's compute substituted by `model`'s paths, and the perf gates' step slowdown;
- `core/`: the patch table and the seam helpers every patch is built on.
The chat template is `chat_template.jinja` beside this file."""
