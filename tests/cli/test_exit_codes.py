"""docs/commands.md's exit-code table is the code's: every code once, every error class's code in it, and every code
in it given by some error class or a command's literal return."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import builders
from builders.errors import ForgeError

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "commands.md"
SIGNALS = {129, 130, 143}  # 128 + SIGHUP, SIGINT, SIGTERM (builders/interrupt.py)


def table_rows() -> list[tuple[list[int], str]]:
    text = TABLE.read_text(encoding="utf-8")
    table = text[text.index("| code | meaning |") :].split("\n\n", 1)[0]
    rows = []
    for row in re.findall(r"^\| ([\d /]+) \| (.+) \|$", table, re.M):
        rows.append(([int(c) for c in row[0].split("/")], row[1]))
    return rows


def error_classes() -> list[type[ForgeError]]:
    """Every ForgeError subclass in builders/ (each module imported; one that needs an absent extra is skipped)."""
    for info in pkgutil.walk_packages(builders.__path__, "builders."):
        # The Triton kernels are built only through triton_layouts.load_kernels, which fixes for the whole process
        # whether they run on a GPU or under the interpreter: importing them here would make it "GPU" for every
        # later test in this process (the kernel cases run under the interpreter). They define no error.
        if info.name.endswith("__main__") or info.name == "builders.kvlab.triton_kernels":
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue
    found: list[type[ForgeError]] = []
    todo: list[type[ForgeError]] = [ForgeError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in found if c.__module__.startswith("builders")]


def literal_returns() -> set[int]:
    """Integer literals a `forge` command handler returns (`return 1 if failed else 0`): the functions each module
    registers with `set_defaults(func=...)`."""
    codes: set[int] = set()
    for path in (ROOT / "builders").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        handlers = {
            kw.value.id
            for call in ast.walk(tree)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "set_defaults"
            for kw in call.keywords
            if kw.arg == "func" and isinstance(kw.value, ast.Name)
        }
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef) or func.name not in handlers:
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Return) and node.value is not None:
                    for const in ast.walk(node.value):
                        if isinstance(const, ast.Constant) and type(const.value) is int:
                            codes.add(const.value)
    assert codes, "no handler found: set_defaults(func=...) is how commands register"
    return codes


def test_each_code_has_one_row() -> None:
    seen: list[int] = [code for codes, _ in table_rows() for code in codes]
    assert len(seen) == len(set(seen)), sorted(c for c in seen if seen.count(c) > 1)
    assert {0, 1, 2} <= set(seen)


def test_every_error_class_exits_with_a_documented_code() -> None:
    documented = {code for codes, _ in table_rows() for code in codes}
    classes = error_classes()
    assert len(classes) > 15, [c.__name__ for c in classes]  # the walk found the package's errors
    undocumented = {f"{c.__module__}.{c.__name__}": c.exit_code for c in classes if c.exit_code not in documented}
    assert undocumented == {}


def test_every_documented_code_is_given_by_the_code() -> None:
    documented = {code for codes, _ in table_rows() for code in codes}
    given = {c.exit_code for c in error_classes()} | literal_returns() | SIGNALS | {0}
    assert documented - given == set()
    assert literal_returns() <= documented
