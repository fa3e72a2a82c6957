"""The packages' import graph: no loop anywhere (imports inside functions count), between modules
and between packages, every package importing only the layers below it, and the library never
reaching into the command line (issues 23, 34)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# source folder -> the package it installs as (pyproject.toml's package-dir)
PACKAGES = {"geoprobe": "geoprobe", "bridges": "geoprobe.bridges", "samplers": "geoprobe.samplers"}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            name = ".".join((package, *path.relative_to(ROOT / folder).with_suffix("").parts))
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
LAYERS = ("geoprobe.report", "geoprobe.metrics", "geoprobe", "geoprobe.samplers", "geoprobe.bridges",
          "geoprobe.workflows", "geoprobe.cli", "front door")
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
    assert {"geoprobe.bridges", "geoprobe.samplers", "geoprobe", "geoprobe.workflows", "geoprobe.cli"} <= set(graph)
    assert cycles(graph) == [], "package loops: " + "; ".join(" <-> ".join(c) for c in cycles(graph))
    upward = [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a]) if LAYERS.index(b) > LAYERS.index(a)]
    assert upward == []


def test_the_package_check_finds_a_loop_between_packages():
    """bridges -> geoprobe -> bridges through different modules is no module loop, but a package loop."""
    modules = {"geoprobe.bridges.fit": {"geoprobe.store"}, "geoprobe.sweep": {"geoprobe.bridges.fit"}}
    assert cycles(modules) == []
    assert cycles(package_graph(modules)) == [["geoprobe", "geoprobe.bridges"]]


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


def test_no_library_function_takes_more_than_8_positional_parameters():
    """A long signature takes its later parameters by keyword (after `*`), so a call names them."""
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                positional = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
                if len(positional) > 8:
                    long.append(f"{name}.{node.name} ({len(positional)} positional)")
    assert long == []


def test_only_the_registry_and_the_record_read_a_checkpoints_kind():
    """bridges/kinds.py is the one table of model kinds: no other module branches on a record's
    "kind" (checkpoint.py only reads and writes the field)."""
    owners = {"geoprobe.bridges.kinds", "geoprobe.bridges.checkpoint"}
    readers = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            key = (node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and node.func.attr == "get" and node.args else node.slice if isinstance(node, ast.Subscript) else None)
            if isinstance(key, ast.Constant) and key.value == "kind" and name not in owners:
                readers.append(f"{name}:{node.lineno}")
    assert readers == []


def test_every_package_folder_installs_and_nothing_imports_the_folders_by_their_own_names():
    """pyproject.toml lists every package (a new subfolder is not forgotten), bridges/ and samplers/
    install inside geoprobe (no top-level name to clash with PyPI's `bridges`), and no module
    imports `bridges` or `samplers` as top-level names (which work only in a source tree)."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join((PACKAGES[p.relative_to(ROOT).parts[0]], *p.relative_to(ROOT).parts[1:-1]))
               for folder in PACKAGES for p in (ROOT / folder).rglob("__init__.py")}
    assert set(setup["packages"]) == folders
    assert setup["package-dir"] == {package: folder for folder, package in PACKAGES.items() if folder != package}
    top_level = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            found = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            top_level += [f"{name}: {m}" for m in found if m.split(".")[0] in ("bridges", "samplers")]
    assert top_level == []


def test_a_source_tree_nobody_installed_finds_bridges_and_samplers_inside_geoprobe():
    """The GPU machine runs a copy of the working tree without installing it: with the editable
    install's finder taken away, geoprobe.bridges and geoprobe.samplers still import, from the
    folders beside geoprobe/."""
    import subprocess
    import sys

    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
            f"sys.path.insert(0, {str(ROOT)!r}); import geoprobe.bridges.kinds, geoprobe.samplers; "
            "print(geoprobe.bridges.kinds.__file__, geoprobe.samplers.__file__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(ROOT / "bridges" / "kinds.py"), str(ROOT / "samplers" / "__init__.py")]
