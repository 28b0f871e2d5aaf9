"""Every template, rendered with hostile values wherever a value from a recipe, a distro or the command line
reaches a RUN line: each value stays one shell word inside single quotes, so none adds a command.

The command line refuses most of these values before they reach a plan (tests/cli/test_cli_input.py); this
test puts them into the plan directly, to prove the templates' quoting holds on its own.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from builders.config.models import GpuMode
from builders.engines import make_plan
from builders.errors import ConfigError
from builders.plan import BuildPlan, PlanOptions
from builders.project import Project
from builders.render import render

ROOT = Path(__file__).resolve().parents[2]
MARK = "pwned"
# Every shell metacharacter a value could use to end its word and start a command of its own.
HOSTILE = f'v\'; {MARK}cmd "$({MARK}sub)" `{MARK}tick` && {MARK}and | {MARK}pipe > {MARK}file & {MARK}bg #c'


def _hostile(plan: BuildPlan) -> BuildPlan:
    changes: dict[str, object] = {
        "context": tuple(
            dataclasses.replace(item, name=f"sources/{HOSTILE}") if item.kind in ("sdist", "source-dir") else item
            for item in plan.context
        ),
        "cmake_defines": dict.fromkeys(plan.cmake_defines, HOSTILE),
        "distro": plan.distro.model_copy(update={"python_executable": HOSTILE}),
    }
    if plan.torch is not None:
        changes["torch"] = dataclasses.replace(plan.torch, version=HOSTILE, index_url=f"https://x/{HOSTILE}")
    recipe_changes: dict[str, object] = {"app_requirements": [HOSTILE]}
    if plan.recipe.wheelhouse is not None:
        recipe_changes["wheelhouse"] = plan.recipe.wheelhouse.model_copy(update={"exclude": (HOSTILE, "other")})
    changes["recipe"] = plan.recipe.model_copy(update=recipe_changes)
    if plan.cuda is not None:
        wheel = plan.cuda.wheel and plan.cuda.wheel.model_copy(update={"filename": HOSTILE})
        changes["cuda"] = dataclasses.replace(plan.cuda, wheel_requirement=HOSTILE, wheel=wheel)
    return dataclasses.replace(plan, **changes)  # type: ignore[arg-type]


# Rendered by tests/rebuild from values of its own (a small C++ project through the dev loop's macros), never
# from a plan: no recipe, distro or command-line value reaches it.
TEST_TEMPLATES = {"devtree-test.Containerfile.j2"}


def plans(project: Project) -> list[tuple[str, BuildPlan]]:
    """One plan per distro × target, the GPU recipes in both modes, BuildKit and the legacy builder, and the CPU
    source recipes from a source tree (--source vllm=DIR) too."""
    out = []
    for distro, recipe in project.pairs():
        modes: tuple[GpuMode | None, ...] = ("source", "wheel") if recipe.cuda else (None,)
        trees = (False, True) if recipe.kind == "source" and not recipe.cuda else (False,)
        for mode in modes:
            for buildkit in (True, False):
                for tree in trees:
                    options = PlanOptions(
                        max_jobs=2,
                        torch_version="2.9.1",
                        gpu_mode=mode,
                        buildkit=buildkit,
                        trust_ca_bundle=True,
                        source_tree=tree,
                    )
                    name = (
                        f"{distro.name}-{recipe.target}{'-' + mode if mode else ''}"
                        f"{'' if buildkit else '-legacy'}{'-tree' if tree else ''}"
                    )
                    out.append((name, make_plan(distro, recipe, options)))
    return out


def run_instructions(text: str) -> list[str]:
    """Each RUN instruction with its continuation lines joined (comment lines inside it dropped)."""
    found, current = [], None
    for line in text.splitlines():
        if current is not None:
            if line.lstrip().startswith("#"):
                continue
            current += " " + line
        elif line.startswith("RUN "):
            current = line[4:]
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1]
        else:
            found.append(current)
            current = None
    return found


def unquoted_marks(command: str) -> list[int]:
    """Offsets where a shell would run part of a hostile value: MARK outside quotes, or an unescaped $( or
    backtick opening on MARK inside double quotes (single quotes hold everything literally)."""
    offsets, state, i = [], None, 0
    while i < len(command):
        c = command[i]
        if state == "'":
            state = None if c == "'" else state
        elif c == "\\":
            i += 2
            continue
        elif state == '"' and (command.startswith(f"$({MARK}", i) or command.startswith(f"`{MARK}", i)):
            offsets.append(i)
        elif c == '"':
            state = None if state == '"' else '"'
        elif c == "'" and state is None:
            state = "'"
        elif state is None and command.startswith(MARK, i):
            offsets.append(i)
        i += 1
    return offsets


@pytest.fixture(scope="module")
def hostile_files() -> dict[str, str]:
    return {name: render(_hostile(plan), Project.load(ROOT).containers_dir) for name, plan in plans(Project.load(ROOT))}


def test_every_template_is_covered(hostile_files: dict[str, str]) -> None:
    templates = {p.name for p in (ROOT / "containers").glob("*.Containerfile.j2")}
    rendered = {plan.template for _, plan in plans(Project.load(ROOT))}
    assert rendered == templates - TEST_TEMPLATES


def test_no_hostile_value_escapes_its_quoting(hostile_files: dict[str, str]) -> None:
    reached = 0
    for name, text in hostile_files.items():
        for command in run_instructions(text):
            if MARK not in command:
                continue
            reached += 1
            assert unquoted_marks(command) == [], f"{name}: {command}"
            lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            # shlex keeps the backslash of \$ and \` in double quotes, where a shell drops it.
            words = [w.replace("\\$", "$").replace("\\`", "`") for w in lexer]
            # Each hostile value is whole inside one word, and no word is a command it tried to add.
            assert all(HOSTILE in w for w in words if MARK in w), f"{name}: {words}"
            assert not any(re.fullmatch(rf"{MARK}\w*", w) for w in words), f"{name}: {words}"
    # Values reach RUN lines in every template: the check above saw them (not a test of nothing).
    assert reached >= len(hostile_files)


def test_a_line_break_in_a_value_is_refused_not_rendered(project: Project) -> None:
    plan = next(p for _, p in plans(project) if p.torch is not None)
    assert plan.torch is not None
    broken = dataclasses.replace(plan, torch=dataclasses.replace(plan.torch, version="2.9\nRUN id"))
    with pytest.raises(ConfigError, match="control character"):
        render(broken, project.containers_dir)
