"""No string field of a distro or recipe can add or change a rendered instruction: a property test.

A crafted root (copies of distros/, recipes/, containers/) gets hostile values in its string fields: line breaks,
carriage returns, a trailing backslash, quotes, `$(…)`, `#`, ` AS x`, `--mount=…`, `../`, right-to-left overrides,
Unicode line separators, NUL, escape sequences, upper case, text Hypothesis makes up. For every pair that a changed
file takes part in, one of two things must happen:

- the value is refused where it enters (a ConfigError naming the file and a key that was changed), or by the
  planner or renderer as a Forge error (never a traceback); or
- the Containerfile renders with exactly the instructions of the clean render: the same keywords in the same
  order, the same flags, the same number of arguments, the same ENV/ARG/LABEL keys, and RUN lines whose shell
  words and operators (&&, ;, |, >, …) are where the template put them.

One test goes through every string field of every file with a set of suffixes, deterministically, and ends with
every pair of the project rendered with changed values; a second one (Hypothesis, derandomized) changes several
fields at once with made-up text.
"""

from __future__ import annotations

import copy
import json
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from builders.config import Distro, Recipe, validation_error_to_config_error
from builders.engines import ENGINES, make_plan
from builders.errors import ConfigError, ForgeError
from builders.plan import PlanOptions
from builders.project import Project
from builders.render import render

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = PlanOptions(max_jobs=2, torch_version="2.9.1", trust_ca_bundle=True)
FRAGMENTS = [
    "\nRUN echo PWNED #",
    "\r\nRUN id",
    "\\",
    " \\",
    " AS evil",
    "'; echo PWNED; '",
    '"',
    "$(id)",
    "`id`",
    "#",
    " && id",
    " ",
    "\u202e",
    "\u2028RUN id",
    "\x00",
    "\t",
    "\x1b[2J",
    "../../",
    " --mount=type=bind,source=/,target=/x",
    "UPPER",
    "a b",
    "",
]

Path_ = tuple[str | int, ...]
_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


# --- what a Containerfile's instructions are -----------------------------------------------------------------


def logical_lines(text: str) -> list[str]:
    """Instructions as Docker's parser reads them: comments dropped (also inside a continuation), a line ending in
    a backslash continued by the next."""
    found: list[str] = []
    current: str | None = None
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("#") or (current is None and not stripped):
            continue
        current = line if current is None else f"{current}\n{line}"
        if current.rstrip(" \t").endswith("\\"):
            current = current.rstrip(" \t")[:-1]
            continue
        found.append(current)
        current = None
    if current is not None:
        found.append(current)
    return found


def shell_shape(command: str) -> tuple[str, ...]:
    """A shell command's shape: each operator as itself, each word as `w` (a quoted value stays one word)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return tuple(token if token and set(token) <= set("();<>|&") else "w" for token in lexer)
    except ValueError as exc:  # an unclosed quote: the shape of a broken command
        return ("unparsable", str(exc))


def shape(line: str) -> tuple[Any, ...]:
    keyword, _, rest = line.strip().partition(" ")
    rest = rest.strip()
    flags: list[str] = []
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        flags.append(flag.split("=", 1)[0])
        rest = rest.strip()
    head = (keyword.upper(), tuple(flags))
    if rest.startswith("["):
        try:
            return (*head, "json", len(json.loads(rest)))
        except ValueError:
            return (*head, "broken json")
    if keyword.upper() == "RUN":
        return (*head, shell_shape(rest))
    if keyword.upper() in ("ENV", "ARG", "LABEL"):
        # Each word a KEY=VALUE or a bare KEY; the keys' names may come from data (a CMake variable a recipe
        # names), which their type holds to a variable's characters.
        try:
            return (*head, tuple("k=v" if "=" in word else "k" for word in shlex.split(rest)))
        except ValueError:
            return (*head, "unparsable")
    return (*head, len(rest.split()))


def instructions(text: str) -> list[tuple[Any, ...]]:
    return [shape(line) for line in logical_lines(text)]


def test_the_shape_sees_an_added_instruction_and_a_changed_one() -> None:
    """The comparison is not blind: the issue's injection, a value that escapes its quotes and one that splits a
    word each change the shape."""
    clean = "FROM b AS x\nENV PATH=/usr/bin\nRUN apt-get install -y 'gcc' && rm -rf /x\n"
    assert instructions(clean) == instructions(clean.replace("gcc", "gcc;id"))  # inside quotes: one word
    for hostile in (
        clean.replace("/usr/bin", "/usr/bin\nRUN echo PWNED #"),
        clean.replace("'gcc'", "'gcc'; id"),
        clean.replace("'gcc'", "gcc g++"),
        clean.replace("/usr/bin", "/usr/bin X=1"),
        clean.replace("/usr/bin", "/usr/bin X"),
        clean.replace("AS x", "AS x y"),
        clean.replace("/usr/bin", "/usr/bin \\"),
    ):
        assert instructions(hostile) != instructions(clean), hostile


# --- the crafted root -------------------------------------------------------------------------------------------


def leaves(data: Any, path: Path_ = ()) -> Iterator[Path_]:
    """Key paths of every string in parsed YAML (mapping values and list items)."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from leaves(value, (*path, index))
    elif isinstance(data, str):
        yield path


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def value_at(data: Any, path: Path_) -> Any:
    for part in path:
        data = data[part]
    return data


def put(data: Any, path: Path_, value: str) -> None:
    value_at(data, path[:-1])[path[-1]] = value


class Crafted:
    """The copy, its clean renders, and the checks of one change."""

    def __init__(self, base: Path) -> None:
        self.root = base / "root"
        for sub in ("distros", "recipes", "containers"):
            shutil.copytree(ROOT / sub, self.root / sub)
        self.files = sorted(p.relative_to(self.root).as_posix() for p in self.root.glob("*/*.yaml"))
        self.text = {f: (self.root / f).read_text(encoding="utf-8") for f in self.files}
        self.data = {f: yaml.safe_load(self.text[f]) for f in self.files}
        self.leaves = {f: list(leaves(self.data[f])) for f in self.files}
        project = Project.load(self.root)
        self.clean = {
            (d.name, r.name): instructions(render(make_plan(d, r, OPTIONS), project.containers_dir))
            for d, r in project.pairs()
        }
        self.checked: set[tuple[str, str]] = set()
        self.outcomes = {"refused at load": 0, "refused when planned or rendered": 0, "same instructions": 0}

    def write(self, file: str, values: dict[Path_, str]) -> None:
        data = copy.deepcopy(self.data[file])
        for path, value in values.items():
            put(data, path, value)
        (self.root / file).write_text(yaml.dump(data, Dumper=_DUMPER, allow_unicode=True), encoding="utf-8")

    def restore(self, file: str) -> None:
        (self.root / file).write_text(self.text[file], encoding="utf-8")

    def loads_alone(self, file: str, values: dict[Path_, str]) -> bool:
        """Whether the file's own model takes the values (no cross-file check, no YAML round trip): a cheap first
        sieve, through the loader's own error path. A refusal must name the file and a changed key."""
        data = copy.deepcopy(self.data[file])
        for path, value in values.items():
            put(data, path, value)
        # A recipe by its serving engine's model, as the project loads it.
        model: type[Distro] | type[Recipe] = (
            Distro if file.startswith("distros/") else ENGINES.recipe_models().pick(data) or Recipe
        )
        try:
            model.model_validate({"name": Path(file).stem, **data})
            return True
        except ValidationError as exc:
            self.refusal(file, values, validation_error_to_config_error(exc, model, str(self.root / file)))
            return False

    def refusal(self, file: str, values: dict[Path_, str], exc: ConfigError) -> None:
        text = exc.render()
        assert file in text, text
        # The key a refusal names is one that was changed (or the list or mapping it sits in).
        assert any(dotted(path[:n]) in text for path in values for n in range(1, len(path) + 1)), (values, text)
        assert "Traceback" not in text
        self.outcomes["refused at load"] += 1

    def check(self, file: str, values: dict[Path_, str]) -> None:
        """Load the whole project with the change; render each pair the file takes part in and compare."""
        self.write(file, values)
        try:
            try:
                project = Project.load(self.root)
                pairs = project.pairs()
            except ConfigError as exc:
                self.refusal(file, values, exc)
                return
            stem = Path(file).stem
            for distro, recipe in pairs:
                key = (distro.name, recipe.name)
                if stem not in key or key not in self.clean:
                    continue
                try:
                    text = render(make_plan(distro, recipe, OPTIONS), project.containers_dir)
                except ForgeError as exc:
                    assert "Traceback" not in exc.render()
                    self.outcomes["refused when planned or rendered"] += 1
                    self.checked.add(key)
                    continue
                assert instructions(text) == self.clean[key], (file, values, key)
                self.outcomes["same instructions"] += 1
                self.checked.add(key)
        finally:
            self.restore(file)

    def check_each_or_halves(self, file: str, values: dict[Path_, str]) -> None:
        """check() all values at once; where the project refuses them together (a cross-file reference changed),
        each half again, down to single values, so that every value's own effect is seen."""
        self.write(file, values)
        try:
            Project.load(self.root).pairs()
            together = True
        except ConfigError as exc:
            together = False
            if len(values) == 1:
                self.refusal(file, values, exc)
        finally:
            self.restore(file)
        if together:
            self.check(file, values)
        elif len(values) > 1:
            items = list(values.items())
            self.check_each_or_halves(file, dict(items[: len(items) // 2]))
            self.check_each_or_halves(file, dict(items[len(items) // 2 :]))


@pytest.fixture(scope="module")
def crafted() -> Iterator[Crafted]:
    with tempfile.TemporaryDirectory(prefix="forge-crafted-") as tmp:
        yield Crafted(Path(tmp))


# Each appended to every string field in turn: the injection, a continuation, a blank that splits a word,
# quotes that would end a shell word, an invisible format character, and a letter most types accept (so that
# every pair is rendered with changed values).
SWEEP = ["\nRUN echo PWNED #", "\\", " AS evil", "'; echo PWNED; '", "\u202e", "x"]


def test_every_string_field_of_every_file_and_every_pair(crafted: Crafted) -> None:
    """Deterministic: each string field of each distro and recipe with each SWEEP suffix; what the file's own model
    takes is applied together (halved where the project refuses it together) and every pair rendered."""
    for file in crafted.files:
        for suffix in SWEEP:
            accepted = {}
            for path in crafted.leaves[file]:
                value = str(value_at(crafted.data[file], path)) + suffix
                if crafted.loads_alone(file, {path: value}):
                    accepted[path] = value
            if accepted:
                crafted.check_each_or_halves(file, accepted)
    assert set(crafted.clean) <= crafted.checked, sorted(set(crafted.clean) - crafted.checked)
    assert all(crafted.outcomes.values()), crafted.outcomes


def hostile_values(original: str) -> st.SearchStrategy[str]:
    fragment = st.sampled_from(FRAGMENTS)
    made_up = st.text(
        alphabet=st.one_of(
            st.characters(codec="utf-8", categories=["Cc", "Cf", "Zs", "Zl", "Zp", "Po", "Sm", "Lu"]),
            st.sampled_from("\n\r\\'\"$`#;&|<>() "),
        ),
        max_size=12,
    )
    return st.one_of(
        fragment.map(lambda f: original + f),
        fragment.map(lambda f: f + original),
        fragment,
        made_up,
        made_up.map(lambda t: original + t),
    )


@st.composite
def changes(draw: st.DrawFn, crafted: Crafted) -> tuple[str, dict[Path_, str]]:
    file = draw(st.sampled_from(crafted.files))
    chosen = draw(st.lists(st.sampled_from(crafted.leaves[file]), min_size=1, max_size=4, unique=True))
    return file, {path: draw(hostile_values(str(value_at(crafted.data[file], path)))) for path in chosen}


def test_hostile_values_in_several_fields_at_once(crafted: Crafted) -> None:
    """Random: several fields of one file at once, with fragments and made-up text around their values."""

    @settings(
        max_examples=100,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(change=changes(crafted))
    def one(change: tuple[str, dict[Path_, str]]) -> None:
        crafted.check(*change)

    one()
    assert crafted.outcomes["refused at load"] and crafted.outcomes["same instructions"], crafted.outcomes
