"""Where the project's data files live, resolved once from the package location."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "fixtures"
TINY_MODEL_RECIPE = FIXTURES / "tiny_model" / "recipe.yaml"
TINY_MODEL_CHAT_TEMPLATE = FIXTURES / "tiny_model" / "chat_template.jinja"
PATCH_CHAT_TEMPLATE = REPO_ROOT / "patches" / "chat_template.jinja"
SCORING_FILE = FIXTURES / "scoring" / "platform.yaml"
BASELINES_DIR = FIXTURES / "baselines"
GATE_POLICY_FILE = FIXTURES / "gates" / "policy.yaml"
PAIRED_TOLERANCES_FILE = FIXTURES / "gates" / "paired.yaml"
REFERENCE_FILE = FIXTURES / "gates" / "reference.yaml"
RUNS_DIR = REPO_ROOT / "runs"
