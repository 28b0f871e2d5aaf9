"""CI workflows rendered from Project.pairs(): one preflight job and one image job per distro × target.

There is no second list: the matrix, the GitHub workflow and the GitLab pipeline all come from the pairs
the nox sessions come from. Preflight is a job of its own so every pair's gates answer within minutes; the
image job (build, the test stage the build runs before tagging, smoke where the recipe's device is cpu)
runs on one runner because the image lives in that runner's engine. Reports and SBOMs are artifacts.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from builders.config import Project
from builders.config.models import Distro, Recipe
from builders.options import flag
from builders.target import Target

GITHUB_PATH = ".github/workflows/forge.yml"
GITLAB_PATH = ".gitlab-ci.yml"
PYTHON = "3.11"
DEFAULT_RUNS_ON = "ubuntu-24.04"
# Hosted runners keep about 14 GB free; recipes needing more get the preinstalled SDKs removed first.
RUNNER_FREE_GB = 14
TIMEOUT_MINUTES = {"source": 360, "wheel": 60, "python-app": 20}


@dataclass(frozen=True, kw_only=True)
class MatrixEntry:
    distro: str
    target: str
    recipe: str
    family: str
    kind: str
    device: str
    job: str  # id-safe name of the pair: letters, digits, - and _
    smoke: bool
    timeout_minutes: int
    disk_gb: float
    base_image: str
    base_tag: str


def job_id(distro: str, target: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{distro}-{target}")


def entry(distro: Distro, recipe: Recipe) -> MatrixEntry:
    target = Target.resolve(distro, recipe)
    return MatrixEntry(
        distro=distro.name,
        target=recipe.target,
        recipe=recipe.name,
        family=distro.family,
        kind=target.kind,
        device=target.device,
        job=job_id(distro.name, recipe.target),
        smoke=target.cpu,
        timeout_minutes=TIMEOUT_MINUTES[target.kind],
        disk_gb=recipe.resources.disk_gb,
        base_image=distro.base.pinned_ref,
        base_tag=distro.base.local_tag,
    )


def matrix(project: Project) -> list[MatrixEntry]:
    return [entry(d, r) for d, r in project.pairs()]


def render_matrix(project: Project) -> str:
    return json.dumps({"include": [asdict(e) for e in matrix(project)]}, indent=2) + "\n"


def _command_lines(e: MatrixEntry, *, locked: bool, allow_incomplete: bool) -> dict[str, str]:
    """The shell each stage runs; shared by both CI formats so they cannot drift apart."""
    report = 'reports/"$FORGE_DISTRO-$FORGE_TARGET"'
    # Preflight fetches the vLLM sdist its gates read; exit 9 (incomplete: a gate not evaluated) fails the job
    # like exit 3 (blocked) unless the workflow was rendered with --allow-incomplete-preflight.
    accept = " --allow-incomplete" if allow_incomplete else ""
    return {
        # The same order builders/bootstrap.ensure_base tries: the registry first; CI runners reach it.
        "base": f"docker pull {e.base_image}\ndocker tag {e.base_image} {e.base_tag}\n",
        "preflight": (
            f"mkdir -p {report}\n"
            f'forge preflight "$FORGE_DISTRO" "$FORGE_TARGET" --json{accept} > {report}/preflight.json\n'
        ),
        "fetch": 'forge fetch "$FORGE_DISTRO" "$FORGE_TARGET"\n',
        "build": f'forge build "$FORGE_DISTRO" "$FORGE_TARGET" --quiet{" " + flag("locked") if locked else ""}\n',
        "smoke": f'forge smoke "forge/$FORGE_DISTRO-$FORGE_TARGET:latest" --profile ci --report {report}/smoke\n',
        "free_disk": (
            "sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc /opt/hostedtoolcache/CodeQL\n"
            "docker system prune --all --force\ndf -h /\n"
        ),
    }


class _Dumper(yaml.SafeDumper):
    """Block scalars for multi-line shell and no anchors, so the rendered file reads like a hand-written one."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(data: dict[str, Any], header: list[str]) -> str:
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120, default_flow_style=False)
    # `on` is a YAML 1.1 boolean to PyYAML, which quotes it; GitHub reads either, people expect it bare.
    body = body.replace("'on':", "on:", 1)
    return "\n".join(f"# {line}".rstrip() for line in header) + "\n" + body


def _header(fmt: str, path: str, options: str) -> list[str]:
    return [
        f"Rendered by `forge ci --format {fmt}` from distros/ × recipes/ (Project.pairs()): do not edit.",
        f"Regenerate: forge ci --format {fmt}{options} -o {path}",
        "One preflight job and one image job (build, test stage, smoke where the device is cpu) per pair.",
    ]


def _setup_steps() -> list[dict[str, Any]]:
    return [
        {"uses": "actions/checkout@v5"},
        {"uses": "actions/setup-python@v6", "with": {"python-version": PYTHON}},
        {"name": "install forge", "run": "python -m pip install -e '.[dev]'"},
    ]


def _upload(e: MatrixEntry, what: str) -> dict[str, Any]:
    return {
        "name": f"upload {what}",
        "if": "always()",
        "uses": "actions/upload-artifact@v6",
        "with": {
            "name": f"{what}-{e.job}",
            "path": f"reports/{e.distro}-{e.target}/",
            "if-no-files-found": "warn",
        },
    }


def _entry(command: str) -> str:
    """A one-command step whose command is the step's entry process. A cancelled or timed-out GitHub job signals
    only that process (SIGINT, then SIGTERM 7.5 s later); a bash waiting for `forge` would not pass it on, and
    Forge would be killed with the process tree before it could stop its build and write its report."""
    assert "\n" not in command.rstrip("\n"), "only a one-command step can exec its command"
    return f"exec {command}"


GITHUB_CANCELLATION = [
    "On cancellation or timeout the runner sends SIGINT, then SIGTERM, to each step's entry process: the build and",
    "smoke steps exec forge, which stops the engine's build or its containers, writes its report as interrupted",
    "(exit 130 or 143; a second signal ends it at once), and the upload steps (if: always()) still run and upload it.",
]


def _options(locked: bool, allow_incomplete: bool) -> str:
    return (" --locked" if locked else "") + (" --allow-incomplete-preflight" if allow_incomplete else "")


def render_github(
    project: Project, *, runs_on: str = DEFAULT_RUNS_ON, locked: bool = False, allow_incomplete: bool = False
) -> str:
    jobs: dict[str, Any] = {}
    for e in matrix(project):
        cmd = _command_lines(e, locked=locked, allow_incomplete=allow_incomplete)
        env = {"FORGE_DISTRO": e.distro, "FORGE_TARGET": e.target}
        jobs[f"preflight-{e.job}"] = {
            "name": f"preflight {e.distro} {e.target}",
            "runs-on": runs_on,
            "timeout-minutes": 15,
            "env": env,
            "steps": [
                *_setup_steps(),
                {"name": "base image", "run": cmd["base"]},
                {"name": "preflight", "run": cmd["preflight"]},
                _upload(e, "preflight"),
            ],
        }
        steps: list[dict[str, Any]] = []
        if e.disk_gb > RUNNER_FREE_GB:
            steps.append({"name": f"free runner disk (the recipe needs {e.disk_gb:g} GB)", "run": cmd["free_disk"]})
        steps += [
            *_setup_steps(),
            {"name": "base image", "run": cmd["base"]},
            {"name": "fetch sources", "run": cmd["fetch"]},
            {"name": "build, test stage, tag, SBOM", "run": _entry(cmd["build"])},
        ]
        if e.smoke:
            steps.append({"name": "smoke", "run": _entry(cmd["smoke"])})
        steps.append(_upload(e, "reports"))
        jobs[f"image-{e.job}"] = {
            "name": f"image {e.distro} {e.target}",
            "needs": f"preflight-{e.job}",
            "runs-on": runs_on,
            "timeout-minutes": e.timeout_minutes,
            "env": env,
            "steps": steps,
        }
    data: dict[str, Any] = {
        "name": "forge images",
        "on": {"push": {"branches": ["main"]}, "pull_request": None, "workflow_dispatch": None},
        "permissions": {"contents": "read"},
        "concurrency": {"group": "forge-${{ github.ref }}", "cancel-in-progress": True},
        "defaults": {"run": {"shell": "bash"}},
        "env": {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"},
        "jobs": jobs,
    }
    options = (f" --runs-on {runs_on}" if runs_on != DEFAULT_RUNS_ON else "") + _options(locked, allow_incomplete)
    return (
        _dump(data, [*_header("github", GITHUB_PATH, options), *GITHUB_CANCELLATION])
        .replace("pull_request: null", "pull_request:")
        .replace("workflow_dispatch: null", "workflow_dispatch:")
    )


def render_gitlab(
    project: Project, *, tags: tuple[str, ...] = (), locked: bool = False, allow_incomplete: bool = False
) -> str:
    """A pipeline for a runner whose jobs reach a Docker engine with host networking (a shell executor)."""
    data: dict[str, Any] = {
        "stages": ["preflight", "image"],
        "variables": {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"},
        ".forge": {"before_script": ["python3 -m pip install -e '.[dev]'"]},
    }
    if tags:
        data[".forge"]["tags"] = list(tags)
    for e in matrix(project):
        cmd = _command_lines(e, locked=locked, allow_incomplete=allow_incomplete)
        variables = {"FORGE_DISTRO": e.distro, "FORGE_TARGET": e.target}
        artifacts = {"when": "always", "paths": [f"reports/{e.distro}-{e.target}/"], "expire_in": "30 days"}
        preflight = f"preflight:{e.distro}:{e.target}"
        data[preflight] = {
            "stage": "preflight",
            "extends": ".forge",
            "timeout": "15m",
            "variables": variables,
            "script": [cmd["base"], cmd["preflight"]],
            "artifacts": artifacts,
        }
        script = [cmd["base"], cmd["fetch"], cmd["build"]] + ([cmd["smoke"]] if e.smoke else [])
        data[f"image:{e.distro}:{e.target}"] = {
            "stage": "image",
            "extends": ".forge",
            "needs": [preflight],
            "timeout": f"{e.timeout_minutes}m",
            "variables": variables,
            "script": script,
            "artifacts": artifacts,
        }
    options = (" " + " ".join(f"--gitlab-tag {t}" for t in tags) if tags else "") + _options(locked, allow_incomplete)
    return _dump(data, _header("gitlab", GITLAB_PATH, options))
