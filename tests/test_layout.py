"""The packages' import graph: no loop anywhere (imports inside functions count), between modules
and between packages, every package importing only the layers below it, and the library never
reaching into the command line (issues 23, 34)."""

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


def cycles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is an import loop."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(graph) | {n for targets in graph.values() for n in targets}):
        if node not in index:
            visit(node)
    return found


# Bottom to top: the presentation and metric leaves, the core (geoprobe's own modules), the
# samplers, the trainable models, the application layer, the command line, and the two front
# doors (`import geoprobe` with its notebook API, `python -m geoprobe`). A package imports only
# the packages below it (docs/architecture.md draws this).
LAYERS = ("geoprobe.report", "geoprobe.metrics", "geoprobe", "samplers", "bridges", "geoprobe.workflows",
          "geoprobe.cli", "front door")
FRONT_DOOR = ("geoprobe", "geoprobe.__main__", "geoprobe.api")


def package_of(module: str) -> str:
    """A module's package: a subpackage of geoprobe/ is a package of its own; the front door's
    modules sit in the top layer."""
    if module in FRONT_DOOR:
        return "front door"
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "geoprobe" and ".".join(parts[:2]) in LAYERS else parts[0]


def package_graph(modules: dict) -> dict:
    """The module graph folded onto packages: which package imports which."""
    graph = defaultdict(set)
    for name, targets in modules.items():
        for target in targets:
            if package_of(name) != package_of(target):
                graph[package_of(name)].add(package_of(target))
    return graph


def test_packages_have_no_loop_and_import_only_the_layers_below():
    top, inner = import_graph()
    graph = package_graph({name: top[name] | inner[name] for name in set(top) | set(inner)})
    assert {"bridges", "samplers", "geoprobe", "geoprobe.workflows", "geoprobe.cli"} <= set(graph)
    assert cycles(graph) == [], "package loops: " + "; ".join(" <-> ".join(c) for c in cycles(graph))
    upward = [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a]) if LAYERS.index(b) > LAYERS.index(a)]
    assert upward == []


def test_the_package_check_finds_a_loop_between_packages():
    """bridges -> geoprobe -> bridges through different modules is no module loop, but a package loop."""
    modules = {"bridges.fit": {"geoprobe.store"}, "geoprobe.sweep": {"bridges.fit"}}
    assert cycles(modules) == []
    assert cycles(package_graph(modules)) == [["bridges", "geoprobe"]]


def test_the_whole_import_graph_has_no_loop():
    """Every import counts, those inside functions too: a loop hidden in a function is still a loop."""
    top, inner = import_graph()
    assert sum(len(v) for v in top.values()) > 50 and inner  # the graph was read
    graph = {name: top[name] | inner[name] for name in set(top) | set(inner)}
    assert cycles(graph) == [], "import loops: " + "; ".join(" <-> ".join(c) for c in cycles(graph))


def test_the_library_never_imports_its_command_line():
    top, inner = import_graph()
    command_line = ("geoprobe.cli", "geoprobe.__main__")  # `python -m geoprobe` is the command line too
    library = [name for name in set(top) | set(inner) if not name.startswith(command_line)]
    calls = [f"{a} -> {b}" for a in sorted(library) for b in sorted(top[a] | inner[a]) if b.startswith("geoprobe.cli")]
    assert calls == []


def test_the_check_finds_a_loop_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []


def test_no_library_function_is_longer_than_80_lines():
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []


def test_only_the_registry_and_the_record_read_a_checkpoints_kind():
    """bridges/kinds.py is the one table of model kinds: no other module branches on a record's
    "kind" (checkpoint.py only reads and writes the field)."""
    owners = {"bridges.kinds", "bridges.checkpoint"}
    readers = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            key = (node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and node.func.attr == "get" and node.args else node.slice if isinstance(node, ast.Subscript) else None)
            if isinstance(key, ast.Constant) and key.value == "kind" and name not in owners:
                readers.append(f"{name}:{node.lineno}")
    assert readers == []
