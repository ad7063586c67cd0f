"""Running code right after a module is imported: how a patch reaches a vLLM class that is imported later in the
process (the step slowdown's engine class), and how the CPU emulation (harness/machine/emulated_site) changes
torch.cpu before anyone reads it. Plain stdlib, as the emulation imports it at interpreter start."""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable

__all__ = ["when_imported"]


def when_imported(name: str, callback: Callable) -> None:
    """`callback(module)` once module `name` is imported: now, or right after the import executes it."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    if any(getattr(f, "module_name", None) == name for f in sys.meta_path):
        return  # already waiting for it

    class AfterImport(importlib.abc.MetaPathFinder):
        module_name = name

        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                callback(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, AfterImport())
