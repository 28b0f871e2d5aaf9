"""The module map in docs/layout.md matches builders/: every package and top-level module is in it, and every
path it names exists. docs/layout.md is the map; docs/architecture.md explains the layers and is held to the
same rule for the `builders/…` paths it names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "builders"
LAYOUT = ROOT / "docs" / "layout.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAP_HEADING = "### Module map (`builders/`)"


def package_units(package: Path) -> set[str]:
    """The top-level modules (`cli.py`) and packages (`smoke/`) of builders/, as the map spells them."""
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    return modules | {f"{p.parent.name}/" for p in package.glob("*/__init__.py")}


def map_rows(text: str) -> list[tuple[list[str], list[str]]]:
    """The module map's table rows: the backticked names of the first column and those of the second."""
    assert MAP_HEADING in text, f"docs/layout.md has no '{MAP_HEADING}' section"
    section = text.split(MAP_HEADING, 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not line.startswith("|") or set(cells[0]) <= {"-", " "}:
            continue
        rows.append((re.findall(r"`([^`]+)`", cells[0]), re.findall(r"`([^`]+)`", cells[1])))
    return rows[1:]  # the header row


def map_problems(text: str, package: Path) -> list[str]:
    """What is wrong with the map against the tree at `package`, each problem as a sentence."""
    problems = []
    rows = map_rows(text)
    named = {name for first, _ in rows for name in first}
    for unit in sorted(package_units(package) - named):
        problems.append(f"builders/{unit} is missing from the module map")
    for first, second in rows:
        for name in first:
            if not (package / name).exists():
                problems.append(f"the map names builders/{name}, which does not exist")
        folders = [package / n for n in first if n.endswith("/")]
        for name in second:
            if not name.endswith(".py") or " " in name:
                continue  # a file the code writes (report.json) or a command, not a module
            if "/" in name:
                found = (package / name).exists()
            else:
                found = any((folder / name).exists() for folder in [package, *folders])
            if not found:
                problems.append(f"the map's row for {', '.join(first)} names {name}, which does not exist")
    return problems


def missing_builders_paths(text: str, root: Path) -> list[str]:
    """The backticked `builders/…` paths in a page that do not exist (`<name>` placeholders skipped)."""
    paths = set(re.findall(r"`(builders/[^`\s]*)`", text))
    return sorted(p for p in paths if "<" not in p and not (root / p).exists())


def test_the_module_map_names_every_package_and_module_and_nothing_else() -> None:
    assert map_problems(LAYOUT.read_text(), PACKAGE) == []


def test_the_builders_paths_the_docs_name_exist() -> None:
    for page in (LAYOUT, ARCHITECTURE):
        assert missing_builders_paths(page.read_text(), ROOT) == [], page.name


def test_a_missing_package_and_a_stale_path_are_both_reported(tmp_path: Path) -> None:
    package = tmp_path / "builders"
    (package / "smoke").mkdir(parents=True)
    for path in ("__init__.py", "cli.py", "plan.py", "smoke/__init__.py", "smoke/stack.py"):
        (package / path).write_text("")
    text = (
        f"# x\n\n{MAP_HEADING}\n\n| module | what it does |\n| --- | --- |\n"
        "| `cli.py` | the CLI |\n| `smoke/` | the stack (`stack.py`, `gone.py`) |\n| `old.py` | removed |\n"
        "\nafter the table\n"
    )
    assert map_problems(text, package) == [
        "builders/plan.py is missing from the module map",
        "the map's row for smoke/ names gone.py, which does not exist",
        "the map names builders/old.py, which does not exist",
    ]
    assert missing_builders_paths("`builders/plan.py`, `builders/gone/`, `builders/<name>.py`", tmp_path) == [
        "builders/gone/"
    ]
