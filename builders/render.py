"""BuildPlan → Containerfile text, through the Jinja2 templates in containers/."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import jinja2
from pydantic import BaseModel

from builders.config.types import NOT_RENDERED, unseen_character
from builders.distros import family_for
from builders.errors import ConfigError
from builders.plan import BUILD_DIR, BuildPlan


@functools.cache
def _environment(containers_dir: Path) -> jinja2.Environment:
    # One per folder and process: each template is compiled once (a render compiled every template it imported,
    # a fifth of a second a pair), and the loader still reloads a template whose file changed.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(containers_dir)),
        # A missing value is an error, never an empty string in a Containerfile.
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["dq"] = json.dumps  # a double-quoted string Dockerfile parsers accept, without HTML escapes
    # A value in a RUN line is one shell word whatever it holds: a version, URL or file name from a recipe or
    # the command line never adds a command. Plain values (torch==2.9.1+cpu, URLs) come out unchanged.
    env.filters["sh"] = shell_word
    env.filters["shdq"] = shell_in_double_quotes  # for a value inside a "…" word of a RUN line
    return env


def _one_line(value: object) -> str:
    text = str(value)
    # Quotes cannot hold a line break in a Containerfile: the instruction would end there and the rest of the
    # value would be read as the next one.
    if any(ord(c) < 0x20 or c == "\x7f" for c in text):
        raise ConfigError(f"{text!r}: a control character (line break, tab …) cannot go into a RUN line")
    return text


def shell_word(value: object) -> str:
    return shlex.quote(_one_line(value))


def shell_in_double_quotes(value: object) -> str:
    """The value with the characters a shell still reads inside double quotes ($ ` " \\) escaped."""
    return re.sub(r'([\\"$`])', r"\\\1", _one_line(value))


def pip_torch_args(plan: BuildPlan) -> str:
    torch = plan.torch
    if torch is None:
        return ""
    if torch.index == "wheelhouse":
        return "--no-index --find-links /opt/forge/wheelhouse"
    if torch.index == "pypi":
        return ""
    return f"--index-url {shell_word(torch.index_url)}"


def _strings(value: object, key: str) -> Iterator[tuple[str, str]]:
    """Every string in a plan's value with its key path (`packages.runtime[2]`), mapping keys included."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            if NOT_RENDERED not in field.metadata:
                yield from _strings(getattr(value, name), f"{key}.{name}" if key else name)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield from _strings(getattr(value, item.name), f"{key}.{item.name}" if key else item.name)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k, f"{key} (a key)")
            yield from _strings(v, f"{key}.{k}")
    elif isinstance(value, tuple | list | frozenset | set):
        for index, item in enumerate(value):
            yield from _strings(item, f"{key}[{index}]")


def refuse_unseen(plan: BuildPlan) -> None:
    """The second line of defence behind the value types (builders/config/types.py): no value of the plan holds a
    line break or another control or format character, whichever way it got in (a model built in code, a field
    without its type). A line break inside a value would end the instruction there and make the rest of the value
    an instruction of its own; quoting cannot hold it."""
    sources = (
        (f"distros/{plan.distro.name}.yaml", plan.distro),
        (f"recipes/{plan.recipe.name}.yaml", plan.recipe),
        ("the build plan (from the distro, the recipe or the command line)", plan),
    )
    for where, value in sources:
        for key, text in _strings(value, ""):
            if key.split(".", 1)[0] in ("distro", "recipe") and value is plan:
                continue  # named above with their files
            found = unseen_character(text)
            if found is not None:
                raise ConfigError(
                    f"{where}: {key}: {text!r} holds {found}: a value with a line break or a control character "
                    "is never written into a Containerfile",
                    hint="keep the value on one line of visible characters",
                )


def render(plan: BuildPlan, containers_dir: Path, *, compiler_cache: object = None) -> str:
    """compiler_cache: builders/cache/'s launcher for the template (None: the engine-local ccache, as always)."""
    refuse_unseen(plan)
    env = _environment(containers_dir)
    try:
        template = env.get_template(plan.template)
        text = template.render(
            plan=plan,
            family=family_for(plan.distro),
            build_dir=BUILD_DIR,
            pip_torch_args=pip_torch_args(plan),
            compiler_cache=compiler_cache,
        )
    except jinja2.TemplateError as exc:
        where = f"{getattr(exc, 'filename', None) or plan.template}:{getattr(exc, 'lineno', '?')}"
        raise ConfigError(f"containers/{where}: {exc}") from exc
    # Collapse the blank lines Jinja's block tags leave, so rendered files read like hand-written ones.
    lines: list[str] = []
    for line in text.splitlines():
        if line.strip() == "" and lines and lines[-1].strip() == "":
            continue
        lines.append(line.rstrip())
    return "\n".join(lines).strip() + "\n"


def render_template(containers_dir: Path, template: str, **values: object) -> str:
    """A template of containers/ rendered with values of the caller's own rather than a BuildPlan, in the same
    environment (StrictUndefined, the quoting filters): the dev loop's test project builds through the same
    macros as vLLM's image (containers/devtree-test.Containerfile.j2)."""
    try:
        return _environment(containers_dir).get_template(template).render(**values)
    except jinja2.TemplateError as exc:
        where = f"{getattr(exc, 'filename', None) or template}:{getattr(exc, 'lineno', '?')}"
        raise ConfigError(f"containers/{where}: {exc}") from exc
