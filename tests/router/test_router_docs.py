"""docs/router.md's promise list and the tests that keep it stay in step, in both directions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOC = HERE.parents[1] / "docs" / "router.md"


def defined_tests(file: Path) -> set[str]:
    tree = ast.parse(file.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_test_the_promise_list_names_exists() -> None:
    text = DOC.read_text()
    named = re.findall(r"`(test_\w+\.py)(?:::(test_\w+))?`", text)
    assert named, "docs/router.md names no tests"
    last_file = None
    for file, test in named:
        path = HERE / file
        assert path.is_file(), f"docs/router.md names {file}, which does not exist"
        if test:
            assert test in defined_tests(path), f"docs/router.md names {file}::{test}, which does not exist"
        last_file = file
    # `::test_x` right after a `file::test` names another test of that file.
    for test in re.findall(r"`::(test_\w+)`", text):
        assert any(test in defined_tests(HERE / f) for f, _ in named), f"docs/router.md names ::{test}, found nowhere"
    assert last_file is not None


def test_every_hardening_test_keeps_a_listed_promise() -> None:
    text = DOC.read_text()
    for test in defined_tests(HERE / "test_router_hardening.py"):
        assert test in text, f"{test} keeps a promise that docs/router.md does not list"
