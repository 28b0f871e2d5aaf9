"""Issue 35's size limits over the whole of builders/: a module past 800 lines or a class past 400 has grown
more than one job, and this fails before a reviewer has to notice."""

from __future__ import annotations

import ast
from pathlib import Path

BUILDERS = Path(__file__).resolve().parents[2] / "builders"
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 400


def test_no_module_over_800_lines_and_no_class_over_400() -> None:
    modules = sorted(BUILDERS.rglob("*.py"))
    assert len(modules) > 100, "builders/ was not found where this test looks"
    too_long: list[str] = []
    for path in modules:
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n") + (0 if text.endswith("\n") else 1)
        name = path.relative_to(BUILDERS.parent)
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                span = node.end_lineno - node.lineno + 1
                if span > MAX_CLASS_LINES:
                    too_long.append(f"{name}: class {node.name} {span} lines")
    assert too_long == []
