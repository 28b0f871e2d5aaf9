"""BuildPlan → Containerfile text, through the Jinja2 templates in containers/."""

from __future__ import annotations

import json
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
    return env


def pip_torch_args(plan: BuildPlan) -> str:
    torch = plan.torch
    if torch is None:
        return ""
    if torch.index == "wheelhouse":
        return "--no-index --find-links /opt/forge/wheelhouse"
    if torch.index == "pypi":
        return ""
    return f"--index-url {torch.index_url}"


def render(plan: BuildPlan, containers_dir: Path) -> str:
    env = _environment(containers_dir)
    try:
        template = env.get_template(plan.template)
        text = template.render(
            plan=plan, family=family_for(plan.distro), build_dir=BUILD_DIR, pip_torch_args=pip_torch_args(plan)
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
