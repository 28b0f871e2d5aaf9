"""The README is a newcomer's first screen: short, and every command, flag, session, link and exit code it gives
is one the code has. Checked against the parser, the nox sessions and the error classes, not against a copy."""

from __future__ import annotations

import argparse
import importlib
import re
import runpy
import shlex
from pathlib import Path

import nox
import pytest

from builders.cli import COMMAND_MODULES, build_parser, innermost_parser
from builders.errors import ForgeError

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# Placeholders the README's commands use, and what stands in for them when parsing.
PLACEHOLDERS = {"REF": "registry.local/forge/x:1", "build.log": "build.log"}
# A newcomer's path, in this order: a venv, the install, the cheap commands, then a build.
FIRST_STEPS = (
    "python3 -m venv",
    "pip install -e",
    "forge list",
    "forge preflight debian-12 cpu",
    "forge diagnose",
    "forge build",
)


def _code_lines() -> list[str]:
    """Each shell line of the README's ```sh blocks, without its comment."""
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", README, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line:
                lines.append(line)
    return lines


def _forge_commands() -> list[list[str]]:
    commands = []
    for line in _code_lines():
        for part in re.split(r"\s*(?:&&|;)\s*", line):
            words = shlex.split(part)
            if words and words[0] == "forge":
                commands.append([PLACEHOLDERS.get(w, w) for w in words[1:]])
    return commands


def test_readme_is_short_and_opens_with_what_forge_is() -> None:
    lines = README.splitlines()
    assert len(lines) < 200
    first_screen = "\n".join(lines[:40])
    assert "## What each job needs" in first_screen
    for need in ("engine", "disk", "RAM", "time", "network"):
        assert need in first_screen


def test_the_first_steps_come_before_the_main_job() -> None:
    lines = _code_lines()
    first = [next(i for i, line in enumerate(lines) if line.startswith(s)) for s in FIRST_STEPS]
    assert first == sorted(first)


@pytest.mark.parametrize("argv", _forge_commands(), ids=" ".join)
def test_every_forge_command_in_the_readme_parses(argv: list[str]) -> None:
    parser = build_parser()
    if argv == ["--version"]:
        return
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"`forge {' '.join(argv)}` does not parse (exit {exc.code})")
    # And every flag it names is a flag of that subcommand, not one argparse let through by accident.
    sub = innermost_parser(parser, argv)
    known = {s for a in sub._actions for s in a.option_strings} | {"--root", "--version"}
    assert {w.split("=")[0] for w in argv if w.startswith("-")} <= known


def test_every_nox_session_in_the_readme_exists() -> None:
    nox.registry.get().clear()
    runpy.run_path(str(ROOT / "noxfile.py"))
    sessions = set(nox.registry.get())
    named = {m for m in re.findall(r"nox -s ([\w.-]+)", README)}
    assert named and named <= sessions, named - sessions
    assert "suite" in named and "nox                #" in README  # the quick run and the full one


def test_ci_runs_the_full_suite_the_readme_names() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert run.rstrip().splitlines()[-1] == "nox -s suite"


def test_every_link_in_the_readme_resolves() -> None:
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert missing == []


def _error_classes() -> list[type[ForgeError]]:
    assert COMMAND_MODULES  # importing builders.cli imported every command module
    for name in ("builders.publish", "builders.repro.errors", "builders.registry.client", "builders.registry.local"):
        importlib.import_module(name)
    found, todo = [], list(ForgeError.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_the_exit_code_table_lists_every_code_forge_uses() -> None:
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    table = text[text.index("| code | meaning |") :].split("\n\n", 1)[0]
    documented = {int(c) for row in re.findall(r"^\| ([\d /]+) \|", table, re.M) for c in row.split("/")}
    used = {cls.exit_code for cls in _error_classes()} | {ForgeError.exit_code}
    assert used <= documented, used - documented
    # The README's own exit codes are the table's.
    readme_codes = {int(a or b) for a, b in re.findall(r"\bexits? (\d+)|\b(\d+) when", README)}
    assert readme_codes and readme_codes <= documented


def test_kvlab_check_exit_code_in_the_docs_is_the_codes() -> None:
    from builders.kvlab.command import KvlabFailed

    kvlab = (ROOT / "docs" / "kvlab.md").read_text(encoding="utf-8")
    assert f"and {KvlabFailed.exit_code} otherwise" in kvlab


def test_no_page_promises_a_build_arg_forge_does_not_have() -> None:
    build = innermost_parser(build_parser(), ["build"])
    flags = {s for a in build._actions for s in a.option_strings}
    assert "--build-arg" not in flags
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        assert "--build-arg" not in page.read_text(encoding="utf-8"), page.name


def test_every_subcommand_in_the_readme_exists() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    named = set(re.findall(r"`forge ([a-z][a-z-]+)", README)) | {
        line.split()[1] for line in _code_lines() if line.startswith("forge ") and not line.startswith("forge --")
    }
    assert {"list", "preflight", "diagnose", "build"} <= named
    assert named <= set(sub.choices), named - set(sub.choices)
