"""The package's import graph has no cycles, counting every way one module reaches another: imports inside
functions (a late import is a cycle hidden, not removed: `build` → `repro.integration` → `repro.resolve` → `build`
was one), imports under `if TYPE_CHECKING:` (a type a module names is a dependency even if it never runs), and
loads by name (`importlib.import_module("builders.x")`, `__import__`). A load by a name the graph cannot read (not
a literal) fails the test, so "no cycle" means none."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "builders"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def name_loads(tree: ast.Module) -> tuple[set[str], list[int]]:
    """The modules `tree` loads by name (`importlib.import_module("m")`, `import_module("m")`, `__import__("m")`),
    and the lines of such loads whose name is not a literal."""
    named: set[str] = set()
    unreadable: list[int] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called not in {"import_module", "__import__"}:
            continue
        first = node.args[0] if node.args else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            named.add(first.value)
        else:
            unreadable.append(node.lineno)
    return named, unreadable


def import_graph() -> dict[str, set[str]]:
    """Module → the builders modules it imports anywhere in its body, `if TYPE_CHECKING:` blocks included, or
    loads by a literal name. `from pkg import sub` counts as importing the submodule; a name that is not a
    submodule counts as importing the package that defines it."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        loaded, _ = name_loads(tree)
        deps |= {m for m in loaded if m in modules}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in modules else node.module)
        graph[name] = deps - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_builders_has_no_import_cycle() -> None:
    graph = import_graph()
    assert "builders.build" in graph and "builders.repro.resolve" in graph["builders.build"] | {
        d for m in graph["builders.build"] for d in graph[m]
    }
    assert cycles(graph) == []


def test_type_checking_imports_and_loads_by_name_are_in_the_graph(tmp_path: Path) -> None:
    tree = ast.parse(
        "import importlib\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from builders.smoke.profile import PoolSettings\n"
        "def late():\n    from builders.build import build\n"
        "PLANNER = importlib.import_module('builders.plan')\nOTHER = __import__('builders.target')\n"
        "def by_variable(name):\n    return importlib.import_module(name)\n"
    )
    assert name_loads(tree) == ({"builders.plan", "builders.target"}, [10])


def test_nothing_in_builders_is_loaded_by_a_name_the_graph_cannot_read() -> None:
    unreadable = {
        name: lines for name, path in _modules().items() if (lines := name_loads(ast.parse(path.read_text()))[1])
    }
    assert unreadable == {}, "load these by an import (or a literal name) so the graph sees them"


def test_packages_of_builders_import_each_other_in_one_direction_only() -> None:
    """Issue 35: no circle between packages either (build ↔ repro was one: a build used repro's lock and SBOM
    phases, and repro's verify-repro ran builds; verify-repro is builders/verify/ now)."""

    def unit(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else parts[0]

    packages: dict[str, set[str]] = {}
    for src, deps in import_graph().items():
        packages.setdefault(unit(src), set())
        for dst in deps:
            packages.setdefault(unit(dst), set())
            if unit(src) != unit(dst):
                packages[unit(src)].add(unit(dst))
    packages.pop("builders", None)
    for deps in packages.values():
        deps.discard("builders")
    assert len(packages) > 20, "the graph was not built"
    assert cycles(packages) == []
