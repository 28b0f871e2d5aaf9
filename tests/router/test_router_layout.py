"""The router's seams hold: the relay does not reach back into the app or dispatch, and no module or class
grows back into the single 1,400-line server it was cut from (docs/architecture.md, "Router")."""

from __future__ import annotations

import ast
from pathlib import Path

ROUTER = Path(__file__).resolve().parents[2] / "builders" / "router"
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 400


def imported_router_modules(module: str) -> set[str]:
    """The builders.router modules a module imports, deferred imports included."""
    tree = ast.parse((ROUTER / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("builders.router."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("builders.router."))
    return found


def test_the_relay_and_the_call_state_do_not_import_what_sits_above_them() -> None:
    above = {"app", "dispatch", "health"}
    assert not imported_router_modules("relay") & above
    assert not imported_router_modules("call") & (above | {"relay"})
    assert "app" not in imported_router_modules("dispatch")


def test_no_router_module_or_class_is_too_long_to_read() -> None:
    modules = sorted(ROUTER.glob("*.py"))
    assert len(modules) > 10, modules
    for path in modules:
        text = path.read_text()
        assert len(text.splitlines()) <= MAX_MODULE_LINES, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                assert length <= MAX_CLASS_LINES, f"{path.name}: class {node.name} has {length} lines"
