"""Broken kernels for the interpreter checks: a copy of a Triton kernel module with one piece of its source
changed, loaded beside the original, so a property can be shown to reject it."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from hypothesis import HealthCheck, Phase, settings

__all__ = ["FALSIFY", "load_mutant"]

# The property run against a mutant: a broken kernel must fail within a few drawn examples; no shrinking (each
# interpreted call is slow), no example database (a stored failure must not replay elsewhere), fixed seed.
FALSIFY = settings(max_examples=10, derandomize=True, database=None, deadline=None,
                   phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))


def load_mutant(original: ModuleType, tmp_path: Path, name: str, old: str, new: str) -> ModuleType:
    """`original`'s source with `old` (found exactly once) replaced by `new`, imported from `tmp_path`."""
    source = Path(original.__file__).read_text()
    assert source.count(old) == 1, f"mutant {name}: {old!r} is not in the kernel exactly once; update the mutant"
    stem = original.__name__.rpartition(".")[2]
    file = tmp_path / f"mutant_{stem}_{name.replace('-', '_')}.py"
    file.write_text(source.replace(old, new))
    # Named inside the original's package, so the copy's relative imports resolve as the original's do.
    spec = importlib.util.spec_from_file_location(f"{original.__package__}._{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
