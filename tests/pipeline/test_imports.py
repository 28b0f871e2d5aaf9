"""The package's import graph has no cycles, counting imports inside functions too (a late import is a cycle
hidden, not removed: `build` → `repro.integration` → `repro.resolve` → `build` was one)."""

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


def _type_only(tree: ast.Module) -> set[ast.AST]:
    """The nodes under `if TYPE_CHECKING:`: annotations a type checker reads, never executed, so no import order
    can depend on them (a serving engine annotating with the profile's PoolSettings while the profile lists the
    engines is a plugin and its registry, not a cycle)."""
    hidden: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                hidden |= set(ast.walk(child))
    return hidden


def import_graph() -> dict[str, set[str]]:
    """Module → the builders modules it imports anywhere in its body that runs. `from pkg import sub` counts as
    importing the submodule; a name that is not a submodule counts as importing the package that defines it."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        hidden = _type_only(tree)
        for node in ast.walk(tree):
            if node in hidden:
                continue
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


def test_only_type_checking_imports_are_left_out_of_the_graph() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from builders.smoke.profile import PoolSettings\n"
        "def late():\n    from builders.build import build\n"
    )
    hidden = _type_only(tree)
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module != "typing"]
    assert [n.module for n in imports if n in hidden] == ["builders.smoke.profile"]
    assert [n.module for n in imports if n not in hidden] == ["builders.build"]


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
