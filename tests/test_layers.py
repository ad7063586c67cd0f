"""The import layers are a contract: pyproject.toml's [tool.importlinter] contracts hold for the checkout, and each
kind of wrong import they exist for breaks them (checked on a copy of the sources with that one import added)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT

PACKAGES = ("tests", "harness", "patches", "model")


def _lint(root: Path) -> subprocess.CompletedProcess:
    # A fresh interpreter in `root`, so the packages it analyses are the ones there; no cache written.
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                           "sys.exit(lint_imports(no_cache=True, no_logo=True))"],
                          cwd=root, capture_output=True, text=True, timeout=120)


def test_the_checkout_keeps_every_contract():
    result = _lint(REPO_ROOT)
    assert result.returncode == 0, f"an import breaks the layers (fix the import, not the contract):\n{result.stdout}"


def _sources_copy(dest: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, dest / package,
                        ignore=lambda _dir, names: [n for n in names if not (n.endswith(".py") or "." not in n)])
    shutil.copy(REPO_ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


@pytest.mark.parametrize(("module", "wrong_import", "broken"), [
    ("model/norm/rms_norm.py", "import harness.errors", "tests above harness above patches above model"),
    ("patches/core/registry.py", "import harness.paths", "tests above harness above patches above model"),
    ("harness/serving/launcher.py", "import harness.gates.servers", "harness: entry points"),
    ("harness/machine/speed.py", "import harness.serving.placement", "harness: entry points"),
    ("harness/bench/metrics.py", "import harness.gates.paired", "harness: entry points"),
    ("patches/core/registry.py", "from . import seams", "patches.core: the seam helpers"),
    ("patches/model_paths/served_choice.py", "from . import served_norms", "patches.model_paths: the served MoE block"),
    ("harness/gates/decision.py", "import harness.gates.paired", "no package contains an import circle"),
    ("harness/tune/measure/point.py", "import harness.tune.table.record", "tune: the command line"),
    ("harness/tune/step/graph.py", "import harness.tune.check.rule", "tune: the command line"),
    ("harness/tune/configs/space.py", "import harness.tune.check.plan", "tune: the command line"),
    ("model/dispatch/paths.py", "import model.norm.rms_norm", "model: the whole model"),
    ("model/gdn/rule.py", "import model.moe.config", "model: the whole model"),
    ("patches/api/openai_errors.py", "from . import openai_error_codes", "patches.api: every API patch stands alone"),
    ("patches/core/seams.py", "import patches.settings", "patches: the plugin and verify"),
    ("patches/model_paths/moe_experts.py", "from . import moe_router", "patches.model_paths: the served MoE block"),
    ("harness/bench/metrics.py", "import harness.serving.placement", None),  # allowed: bench builds on serving
])
def test_a_wrong_way_import_breaks_its_contract(tmp_path, module, wrong_import, broken):
    root = _sources_copy(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n{wrong_import}  # added by the test\n")
    result = _lint(root)
    if broken is None:
        assert result.returncode == 0, result.stdout
        return
    assert result.returncode == 1, f"{wrong_import} in {module} broke no contract:\n{result.stdout}"
    assert f"{broken}" in result.stdout and "BROKEN" in result.stdout, result.stdout


MOST_MODULES = 15  # a room a newcomer can scan; docs/design.md's layout rule


def test_no_package_holds_more_than_fifteen_modules():
    crowded = {}
    for package in ("harness", "patches", "model"):
        for folder in [REPO_ROOT / package, *(REPO_ROOT / package).rglob("*")]:
            if folder.is_dir() and (folder / "__init__.py").is_file():
                modules = sorted(p.name for p in folder.glob("*.py"))
                if len(modules) > MOST_MODULES:
                    crowded[str(folder.relative_to(REPO_ROOT))] = len(modules)
    assert not crowded, f"split these by concern (docs/design.md, layout): {crowded}"
