"""BuildPlan → Containerfile text, through the Jinja2 templates in containers/."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jinja2

from builders.distros import family_for
from builders.errors import ConfigError
from builders.plan import BUILD_DIR, BuildPlan


def _environment(containers_dir: Path) -> jinja2.Environment:
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


def render(plan: BuildPlan, containers_dir: Path, *, compiler_cache: object = None) -> str:
    """compiler_cache: builders/cache/'s launcher for the template (None: the engine-local ccache, as always)."""
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
