"""vLLM's out-of-tree registry as the plugin's seam for whole layers and ops.

vLLM 0.32's `CustomOp` (an op) and `PluggableLayer` (a whole layer) look their class up when vLLM instantiates
them: `__new__` takes the in-tree class's own name and, where `custom_op.op_registry_oot` holds a class under it,
builds that class instead. `InTree.register_oot(Ours)` stores `Ours` there; hardware plugins (vllm-ascend) serve
their kernels this way. Registering is all a patch does, so a renamed private method cannot break it silently: a
renamed class or a missing registry is found by `registry_reason` and reported as `not applicable`.

Two details of `register_oot` this module undoes or guards:
- it sets `Ours.name` to the in-tree class's Python name (`GemmaRMSNorm`), where vLLM's own class is called by
  its registered name (`gemma_rms_norm`); `enabled()` reads `name` against `--compilation-config custom_ops`
  (`+gemma_rms_norm` / `-gemma_rms_norm`), so the substitute gets the in-tree `name` back and vLLM's own forward,
  which it falls back to, is chosen exactly as it would be without the plugin;
- it asserts that a name is registered once: a second install here is a no-op, and another plugin's class
  under the same name is an error naming it (two plugins cannot both replace one layer).

The registry holds classes for the process; registering must happen before vLLM builds the model, which a
`vllm.general_plugins` entry point does (patches.plugin).
"""
from __future__ import annotations

import importlib

__all__ = ["REGISTRY_MODULE", "registry_reason", "register", "unregister", "registered"]

REGISTRY_MODULE = "vllm.model_executor.custom_op"


def _registry() -> dict:
    return importlib.import_module(REGISTRY_MODULE).op_registry_oot


def registry_reason(module: str, class_name: str) -> str | None:
    """None when `module.class_name` exists and vLLM's out-of-tree registry can replace it, else why not (an
    older vLLM, such as a platform build from before the registry, or a renamed class)."""
    try:
        registry = importlib.import_module(REGISTRY_MODULE)
    except ImportError as exc:
        return f"{REGISTRY_MODULE} cannot be imported ({exc})"
    if not isinstance(getattr(registry, "op_registry_oot", None), dict):
        return f"{REGISTRY_MODULE} has no op_registry_oot: this vLLM predates the out-of-tree registry"
    try:
        cls = getattr(importlib.import_module(module), class_name)
    except (ImportError, AttributeError) as exc:
        return f"{module}.{class_name} is not there ({type(exc).__name__}: {exc})"
    if not callable(getattr(cls, "register_oot", None)):
        return f"{module}.{class_name} has no register_oot: not a CustomOp or PluggableLayer in this vLLM"
    return None


def registered(in_tree: type) -> type | None:
    registry = getattr(importlib.import_module(REGISTRY_MODULE), "op_registry_oot", None)
    return registry.get(in_tree.__name__) if isinstance(registry, dict) else None


def register(in_tree: type, ours: type) -> None:
    """Serve `ours` wherever vLLM instantiates `in_tree` (idempotent)."""
    held = registered(in_tree)
    if held is ours:
        return
    if held is not None:
        raise RuntimeError(f"vLLM's out-of-tree registry already replaces {in_tree.__name__} with "
                           f"{held.__module__}.{held.__qualname__} (another plugin?): two plugins cannot both "
                           "replace one layer; turn one off")
    in_tree_name = getattr(in_tree, "name", None)
    in_tree.register_oot(ours)
    if in_tree_name is not None:
        ours.name = in_tree_name  # see the module docstring: vLLM's custom_ops switches keep their meaning


def unregister(in_tree: type, ours: type) -> None:
    """Give `in_tree` back to vLLM (tests), if `ours` is what the registry holds."""
    if registered(in_tree) is ours:
        del _registry()[in_tree.__name__]
