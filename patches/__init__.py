"""The serving patch set: chat template, vLLM plugin and request compatibility helpers (imports `model`)."""
