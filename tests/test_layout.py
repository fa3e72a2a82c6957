"""The package's import graph: no import inside a function hides an import loop (issue 13)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("geoprobe", "bridges", "samplers")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imported(node, modules) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    base = node.module or ""
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            if f"{base}.{a.name}" in modules or base in modules]


def import_graph() -> tuple[dict, dict]:
    """(top-level edges, edges made by imports inside functions) between the project's modules."""
    modules = _modules()
    top, inner = defaultdict(set), defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        in_function = {id(sub) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                for target in _imported(node, modules):
                    if target != name:
                        (inner if id(node) in in_function else top)[name].add(target)
    return top, inner


def _reaches(top, start: str, goal: str) -> bool:
    seen, stack = set(), [start]
    while stack:
        here = stack.pop()
        if here == goal:
            return True
        if here not in seen:
            seen.add(here)
            stack.extend(top[here])
    return False


def test_no_import_inside_a_function_hides_an_import_loop():
    top, inner = import_graph()
    assert sum(len(v) for v in top.values()) > 50 and inner  # the graph was read
    hidden = [f"{a} -> {b}" for a in sorted(inner) for b in sorted(inner[a]) if _reaches(top, b, a)]
    assert hidden == [], "moving these imports to the top would make a loop: " + ", ".join(hidden)


def test_the_check_finds_a_loop_when_there_is_one():
    top = defaultdict(set, {"a": {"b"}, "b": {"c"}})
    assert _reaches(top, "c", "c") and _reaches(top, "a", "c") and not _reaches(top, "c", "a")
