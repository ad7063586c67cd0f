"""patches/ imports in one direction: plugin and verify -> settings -> catalog -> the patch modules -> seams ->
registry, the leaf. Read from the source (every import, in a function or not), so a late import that closes a
circle is caught too."""
from __future__ import annotations

import ast
from pathlib import Path

PATCHES_DIR = Path(__file__).resolve().parents[2] / "patches"


def _patch_imports(path: Path) -> set[str]:
    """The patches/ modules `path` imports (`from . import x`, `from .x import y`, `import patches.x`...)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1 or base == "patches" or base.startswith("patches."):
                base = base.removeprefix("patches").lstrip(".")
                found |= {base.split(".")[0]} if base else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("patches.")}
    return found & {p.stem for p in PATCHES_DIR.glob("*.py")}


def _graph() -> dict[str, set[str]]:
    return {p.stem: _patch_imports(p) - {p.stem} for p in PATCHES_DIR.glob("*.py")}


def test_the_reader_sees_the_imports_it_must():
    graph = _graph()
    assert {"seams", "registry"} <= graph["truncated_tool_arguments"] | graph["seams"]
    assert "catalog" in graph["settings"] and "moe_experts" in graph["catalog"]


def test_no_import_circle_in_patches():
    graph = _graph()

    def reach(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += graph.get(name, ())
        return seen

    circles = sorted(name for name in graph if name in reach(name))
    assert circles == [], f"modules on an import circle: {circles} ({ {n: sorted(graph[n]) for n in circles} })"


def test_the_registry_is_a_leaf():
    assert _graph()["registry"] == set()
