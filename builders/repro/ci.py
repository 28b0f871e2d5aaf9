"""CI workflows rendered from Project.pairs(): one preflight job and one image job per distro × target.

There is no second list: the matrix, the GitHub workflow and the GitLab pipeline all come from the pairs
the nox sessions come from. Preflight is a job of its own so every pair's gates answer within minutes; the
image job (build, the test stage the build runs before tagging, smoke where the recipe's device is cpu)
runs on one runner because the image lives in that runner's engine. Reports and SBOMs are artifacts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TypedDict

import yaml

from builders.config.models import Distro, Recipe
from builders.options import flag
from builders.platforms import PLATFORMS, for_platform
from builders.project import Project
from builders.target import Target

GITHUB_PATH = ".github/workflows/forge.yml"
GITLAB_PATH = ".gitlab-ci.yml"
PYTHON = "3.11"
DEFAULT_RUNS_ON = "ubuntu-24.04"
# GitHub's native arm64 runner: an arm64 build there needs no emulation (a from-source vLLM build under
# qemu-user-static is far too slow; README "Publishing").
ARM64_RUNS_ON = "ubuntu-24.04-arm"
# The registry every push goes to: one parameter (`forge ci --registry`). GitHub's own needs only GITHUB_TOKEN.
DEFAULT_REGISTRY = "ghcr.io/${{ github.repository_owner }}"
ON_MAIN = "github.event_name == 'push' && github.ref == 'refs/heads/main'"
# Hosted runners keep about 14 GB free; recipes needing more get the preinstalled SDKs removed first.
RUNNER_FREE_GB = 14
# native: a llama-server compile, about 10 min on 2 cores with tests and tools off.
TIMEOUT_MINUTES = {"source": 360, "wheel": 60, "python-app": 20, "native": 60}
# Caches that outlive the runner (builders/cache/, docs/ci-caches.md): where they are comes from the repository's
# configuration (GitHub: repository variables; GitLab: CI/CD variables), the credentials from its secrets, handed
# to the build step alone. Image jobs import only; one job on the default branch exports, so a pull request can
# never write what main builds from.
CACHE_SECRETS = (
    "SCCACHE_REDIS_USERNAME",
    "SCCACHE_REDIS_PASSWORD",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "SCCACHE_WEBDAV_USERNAME",
    "SCCACHE_WEBDAV_PASSWORD",
    "SCCACHE_WEBDAV_TOKEN",
)
WARMED_KINDS = ("source", "native")


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
    platforms: tuple[str, ...]  # linux/amd64, and linux/arm64 where the distro bootstraps aarch64


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
        smoke=target.smokes,
        timeout_minutes=TIMEOUT_MINUTES[target.kind],
        disk_gb=recipe.resources.disk_gb,
        base_image=distro.base.pinned_ref,
        base_tag=distro.base.local_tag,
        platforms=tuple(
            p.name for p in PLATFORMS.values() if p.native or (not target.cuda and p.arch in _arches(distro))
        ),
    )


def _arches(distro: Distro) -> tuple[str, ...]:
    return distro.base.bootstrap.arches if distro.base.bootstrap else (distro.arch,)


def matrix(project: Project) -> list[MatrixEntry]:
    return [entry(d, r) for d, r in project.pairs()]


def render_matrix(project: Project) -> str:
    return json.dumps({"include": [asdict(e) for e in matrix(project)]}, indent=2) + "\n"


def _platform_lines(e: MatrixEntry, platform: str, project: Project, cmd: dict[str, str]) -> dict[str, str]:
    """What differs for a second platform: the base pulled for it, the flag on fetch and build, its report."""
    plat = PLATFORMS[platform]
    distro = for_platform(project.distro(e.distro), plat)
    report = f"reports/{e.distro}-{e.target}{plat.suffix}"
    return {
        "base": f"docker pull --platform {plat.name} {e.base_image}\ndocker tag {e.base_image} {distro.base.local_tag}\n",
        "fetch": f'forge fetch "$FORGE_DISTRO" "$FORGE_TARGET" --platform {plat.name}\n',
        "build": cmd["build"].rstrip("\n") + f" --platform {plat.name}\n",
        "smoke": f'forge smoke "forge/$FORGE_DISTRO-$FORGE_TARGET{plat.suffix}:latest" --profile ci --report {report}/smoke\n',
        "report": report,
    }


def push_ref(e: MatrixEntry, platform: str | None, registry_var: str) -> str:
    """Where an image job pushes: TAG-ARCH for one platform of several (the manifest job writes TAG), else TAG."""
    tag = "${FORGE_TAG}" + (f"-{PLATFORMS[platform].oci_arch}" if platform and len(e.platforms) > 1 else "")
    return f'"{registry_var}/forge/{e.distro}-{e.target}:{tag}"'


def _push_lines(
    e: MatrixEntry, platform: str, report: str, *, summary: str, output: str | None, name: str = "digest"
) -> str:
    """Push by digest, then the registry's digest (read back from report.json) to the job summary."""
    ref = push_ref(e, platform, "$FORGE_REGISTRY")
    lines = (
        f'forge push "$FORGE_DISTRO" "$FORGE_TARGET" {ref} --platform {platform}\n'
        f"digest=$(python -c \"import json; print(json.load(open('{report}/report.json'))['push']['digest'])\")\n"
        f'echo "- {e.distro} {e.target} {platform}: \\`$FORGE_REGISTRY/forge/{e.distro}-{e.target}@$digest\\`" '
        f'>> "{summary}"\n'
    )
    if output:
        lines += f'echo "{name}=$digest" >> "{output}"\n'
    return lines


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


# The documents both formats render, keyed as GitHub Actions and GitLab CI name the keys (Step and Job in the
# functional form: `if`, `with` and hyphenated keys are no Python names).
Step = TypedDict(
    "Step",
    {
        "name": str,
        "id": str,
        "if": str,
        "uses": str,
        "with": dict[str, str],
        "env": dict[str, str],
        "run": str,
        "continue-on-error": bool,
    },
    total=False,
)
Job = TypedDict(
    "Job",
    {
        "name": str,
        "needs": str | list[str],
        "if": str,
        "runs-on": str,
        "timeout-minutes": int,
        "permissions": dict[str, str],
        "env": dict[str, str],
        "outputs": dict[str, str],
        "steps": list[Step],
    },
    total=False,
)


class Workflow(TypedDict):
    """A GitHub Actions workflow."""

    name: str
    on: dict[str, dict[str, list[str]] | None]
    permissions: dict[str, str]
    concurrency: dict[str, str | bool]
    defaults: dict[str, dict[str, str]]
    env: dict[str, str]
    jobs: dict[str, Job]


class Artifacts(TypedDict, total=False):
    when: str
    paths: list[str]
    expire_in: str
    reports: dict[str, str]


class GitlabJob(TypedDict, total=False):
    """A GitLab CI job, or the hidden job (`.forge`) the others extend."""

    stage: str
    extends: str
    needs: list[str]
    rules: list[dict[str, str]]
    timeout: str
    variables: dict[str, str]
    before_script: list[str]
    script: list[str]
    artifacts: Artifacts
    tags: list[str]


Pipeline = dict[str, GitlabJob | list[str] | dict[str, str]]
"""A GitLab pipeline: `stages`, `variables`, then the jobs by name (`.forge` the one they extend)."""


class _Dumper(yaml.SafeDumper):
    """Block scalars for multi-line shell and no anchors, so the rendered file reads like a hand-written one."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(data: Mapping[str, object], header: list[str]) -> str:
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


def _setup_steps() -> list[Step]:
    return [
        {"uses": "actions/checkout@v5"},
        {"uses": "actions/setup-python@v6", "with": {"python-version": PYTHON}},
        {"name": "install forge", "run": "python -m pip install -e '.[dev]'"},
    ]


def _upload(e: MatrixEntry, what: str) -> Step:
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


def _login_step() -> Step:
    return {
        "name": "log in to the registry",
        "if": ON_MAIN,
        "env": {
            "REGISTRY_USER": "${{ secrets.FORGE_REGISTRY_USER || github.actor }}",
            "REGISTRY_TOKEN": "${{ secrets.FORGE_REGISTRY_TOKEN || secrets.GITHUB_TOKEN }}",
        },
        "run": 'echo "$REGISTRY_TOKEN" | docker login "${FORGE_REGISTRY%%/*}" -u "$REGISTRY_USER" --password-stdin\n',
    }


def _image_job(project: Project, e: MatrixEntry, platform: str, cmd: dict[str, str], runs_on: str) -> Job:
    """One platform's image job: build, test stage, smoke on cpu, and on main the push by digest."""
    native = platform == PLATFORMS["linux/amd64"].name
    lines = dict(cmd) if native else {**cmd, **_platform_lines(e, platform, project, cmd)}
    report = f"reports/{e.distro}-{e.target}" if native else lines["report"]
    steps: list[Step] = []
    if e.disk_gb > RUNNER_FREE_GB:
        steps.append({"name": f"free runner disk (the recipe needs {e.disk_gb:g} GB)", "run": cmd["free_disk"]})
    steps += [
        *_setup_steps(),
        *_cache_steps(),
        {"name": "base image", "run": lines["base"]},
        {"name": "fetch sources", "run": lines["fetch"]},
        {"name": "build, test stage, tag, SBOM", "env": _cache_secrets(), "run": _entry(lines["build"])},
    ]
    if e.smoke:
        steps.append({"name": "smoke", "run": _entry(lines["smoke"])})
    steps += [
        _login_step(),
        {
            "name": "push by digest",
            "id": "push",
            "if": ON_MAIN,
            "run": _push_lines(e, platform, report, summary="$GITHUB_STEP_SUMMARY", output="$GITHUB_OUTPUT"),
        },
    ]
    upload = _upload(e, "reports")
    upload["with"] = {**upload["with"], "path": f"{report}/"}
    if not native:
        upload["with"]["name"] += f"-{PLATFORMS[platform].oci_arch}"
    steps.append(upload)
    return {
        "name": f"image {e.distro} {e.target}" + ("" if native else f" {platform}"),
        "needs": f"preflight-{e.job}",
        "runs-on": runs_on if native else ARM64_RUNS_ON,
        "timeout-minutes": e.timeout_minutes,
        "permissions": {"contents": "read", "packages": "write"},
        "env": {"FORGE_DISTRO": e.distro, "FORGE_TARGET": e.target},
        "outputs": {"digest": "${{ steps.push.outputs.digest }}"},
        "steps": steps,
    }


def _cache_secrets() -> dict[str, str]:
    """The compiler cache's credentials, from the repository's secrets of the same names: an unset one is empty,
    which Forge reads as absent."""
    return {name: f"${{{{ secrets.{name} }}}}" for name in CACHE_SECRETS}


def _cache_steps() -> list[Step]:
    """Before a build: a login to the cache registry where one is configured, and GitHub's cache service handed to
    sccache where the compiler cache is `gha` (GitHub gives its URL and token to actions only)."""
    return [
        {
            "name": "log in to the cache registry",
            "if": "env.FORGE_CACHE_REGISTRY != ''",
            "env": {
                "REGISTRY_USER": "${{ secrets.FORGE_CACHE_REGISTRY_USER || github.actor }}",
                "REGISTRY_TOKEN": "${{ secrets.FORGE_CACHE_REGISTRY_TOKEN || secrets.GITHUB_TOKEN }}",
            },
            "run": 'echo "$REGISTRY_TOKEN" | docker login "${FORGE_CACHE_REGISTRY%%/*}" -u "$REGISTRY_USER" '
            "--password-stdin\n",
        },
        {
            "name": "hand GitHub's cache service to sccache",
            "if": "env.FORGE_COMPILER_CACHE == 'gha'",
            "uses": "actions/github-script@v8",
            "with": {
                "script": "core.exportVariable('ACTIONS_RESULTS_URL', process.env.ACTIONS_RESULTS_URL || '');\n"
                "core.exportVariable('ACTIONS_RUNTIME_TOKEN', process.env.ACTIONS_RUNTIME_TOKEN || '');\n"
            },
        },
    ]


def _warm_job(project: Project, runs_on: str, *, locked: bool) -> Job | None:
    """One job on the default branch that builds every compiled pair with the export on, so the next pull
    request's runners find the layers and the objects; a pair that fails here fails no one."""
    entries = [e for e in matrix(project) if e.kind in WARMED_KINDS]
    if not entries:
        return None
    steps: list[Step] = []
    if any(e.disk_gb > RUNNER_FREE_GB for e in entries):
        free = _command_lines(entries[0], locked=locked, allow_incomplete=False)["free_disk"]
        steps.append({"name": "free runner disk", "run": free})
    steps += [*_setup_steps(), *_cache_steps()]
    for e in entries:
        cmd = _command_lines(e, locked=locked, allow_incomplete=False)
        env = {"FORGE_DISTRO": e.distro, "FORGE_TARGET": e.target}
        build = cmd["build"].rstrip("\n") + " --skip-tests\n"
        steps += [
            {
                "name": f"{e.distro} {e.target}: base and sources",
                "continue-on-error": True,
                "env": env,
                "run": cmd["base"] + cmd["fetch"],
            },
            {
                "name": f"warm {e.distro} {e.target}",
                "continue-on-error": True,
                "env": {**env, **_cache_secrets()},
                "run": _entry(build),
            },
        ]
    steps.append(
        {
            "name": "upload reports",
            "if": "always()",
            "uses": "actions/upload-artifact@v6",
            "with": {"name": "reports-warm-caches", "path": "reports/", "if-no-files-found": "warn"},
        }
    )
    return {
        "name": "warm the caches (default branch)",
        "if": ON_MAIN,
        "runs-on": runs_on,
        "timeout-minutes": TIMEOUT_MINUTES["source"],
        "permissions": {"contents": "read", "packages": "write"},
        "env": {"FORGE_CACHE_EXPORT": "1"},
        "steps": steps,
    }


def platform_job(e: MatrixEntry, platform: str) -> str:
    return f"image-{e.job}" if platform == "linux/amd64" else f"{PLATFORMS[platform].oci_arch}-{e.job}"


def _manifest_job(e: MatrixEntry) -> Job:
    """After every platform's image job: one name for all of them, the index digest in the summary."""
    needs = [platform_job(e, p) for p in e.platforms]
    images = " ".join(f"{p}=${{{{ needs.{platform_job(e, p)}.outputs.digest }}}}" for p in e.platforms)
    ref = push_ref(e, None, "$FORGE_REGISTRY")
    run = (
        f"forge index {ref} {images} --json > index.json\n"
        "digest=$(python -c \"import json; print(json.load(open('index.json'))['digest'])\")\n"
        f'echo "- {e.distro} {e.target} index ({", ".join(e.platforms)}): '
        f'\\`$FORGE_REGISTRY/forge/{e.distro}-{e.target}@$digest\\`" >> "$GITHUB_STEP_SUMMARY"\n'
    )
    return {
        "name": f"manifest {e.distro} {e.target}",
        "needs": needs,
        "if": ON_MAIN,
        "runs-on": DEFAULT_RUNS_ON,
        "timeout-minutes": 10,
        "permissions": {"contents": "read", "packages": "write"},
        "steps": [*_setup_steps(), _login_step(), {"name": "index of every platform", "run": run}],
    }


# By default the caches are the repository's configuration, not the workflow's: variables that may be unset.
GITHUB_COMPILER_CACHE = "${{ vars.FORGE_COMPILER_CACHE }}"
GITHUB_CACHE_REGISTRY = "${{ vars.FORGE_CACHE_REGISTRY }}"
GITHUB_CACHES = [
    "Caches (docs/ci-caches.md): repository variables FORGE_COMPILER_CACHE (redis://…, s3://…, webdav+https://…, gha)",
    "and FORGE_CACHE_REGISTRY (HOST/REPO); the backend's credentials are secrets of sccache's own names, given to the",
    "build steps alone. Image jobs import; the warm-caches job on the default branch exports.",
]


def render_github(
    project: Project,
    *,
    runs_on: str = DEFAULT_RUNS_ON,
    locked: bool = False,
    allow_incomplete: bool = False,
    registry: str = DEFAULT_REGISTRY,
    compiler_cache: str = GITHUB_COMPILER_CACHE,
    cache_registry: str = GITHUB_CACHE_REGISTRY,
) -> str:
    jobs: dict[str, Job] = {}
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
        for platform in e.platforms:
            jobs[platform_job(e, platform)] = _image_job(project, e, platform, cmd, runs_on)
        if len(e.platforms) > 1:
            jobs[f"manifest-{e.job}"] = _manifest_job(e)
    warm = _warm_job(project, runs_on, locked=locked)
    if warm is not None:
        jobs["warm-caches"] = warm
    data: Workflow = {
        "name": "forge images",
        "on": {"push": {"branches": ["main"]}, "pull_request": None, "workflow_dispatch": None},
        "permissions": {"contents": "read"},
        "concurrency": {"group": "forge-${{ github.ref }}", "cancel-in-progress": True},
        "defaults": {"run": {"shell": "bash"}},
        "env": {
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PYTHONUNBUFFERED": "1",
            "FORGE_REGISTRY": registry,
            "FORGE_TAG": "${{ github.sha }}",
            "FORGE_COMPILER_CACHE": compiler_cache,
            "FORGE_CACHE_REGISTRY": cache_registry,
            "FORGE_CACHE_EXPORT": "0",
        },
        "jobs": jobs,
    }
    options = (
        (f" --runs-on {runs_on}" if runs_on != DEFAULT_RUNS_ON else "")
        + (f" --registry {registry}" if registry != DEFAULT_REGISTRY else "")
        + (f" --compiler-cache {compiler_cache}" if compiler_cache != GITHUB_COMPILER_CACHE else "")
        + (f" --cache-registry {cache_registry}" if cache_registry != GITHUB_CACHE_REGISTRY else "")
        + _options(locked, allow_incomplete)
    )
    return (
        _dump(data, [*_header("github", GITHUB_PATH, options), *GITHUB_CANCELLATION, *GITHUB_CACHES])
        .replace("pull_request: null", "pull_request:")
        .replace("workflow_dispatch: null", "workflow_dispatch:")
    )


GITLAB_REGISTRY = "$CI_REGISTRY_IMAGE"
GITLAB_ON_MAIN = '$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH && $CI_PIPELINE_SOURCE == "push"'


def render_gitlab(
    project: Project,
    *,
    tags: tuple[str, ...] = (),
    locked: bool = False,
    allow_incomplete: bool = False,
    registry: str = GITLAB_REGISTRY,
) -> str:
    """A pipeline for a runner whose jobs reach a Docker engine with host networking (a shell executor)."""
    # GitLab hands every CI/CD variable to every job: FORGE_COMPILER_CACHE, FORGE_CACHE_REGISTRY and the backend's
    # credentials (masked variables of sccache's own names) need no line here. Image jobs import only.
    cache_login = (
        'if [ -n "${FORGE_CACHE_REGISTRY:-}" ]; then echo "$CI_REGISTRY_PASSWORD" | docker login "$CI_REGISTRY" '
        '-u "$CI_REGISTRY_USER" --password-stdin; fi'
    )
    forge: GitlabJob = {"before_script": ["python3 -m pip install -e '.[dev]'", cache_login]}
    if tags:
        forge["tags"] = list(tags)
    data: Pipeline = {
        "stages": ["preflight", "image", "manifest", "warm"],
        "variables": {
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PYTHONUNBUFFERED": "1",
            "FORGE_REGISTRY": registry,
            "FORGE_TAG": "$CI_COMMIT_SHA",
            "FORGE_CACHE_EXPORT": "0",
        },
        ".forge": forge,
    }
    login = 'echo "$CI_REGISTRY_PASSWORD" | docker login "$CI_REGISTRY" -u "$CI_REGISTRY_USER" --password-stdin\n'
    for e in matrix(project):
        cmd = _command_lines(e, locked=locked, allow_incomplete=allow_incomplete)
        variables = {"FORGE_DISTRO": e.distro, "FORGE_TARGET": e.target}
        artifacts: Artifacts = {"when": "always", "paths": [f"reports/{e.distro}-{e.target}/"], "expire_in": "30 days"}
        preflight = f"preflight:{e.distro}:{e.target}"
        data[preflight] = {
            "stage": "preflight",
            "extends": ".forge",
            "timeout": "15m",
            "variables": variables,
            "script": [cmd["base"], cmd["preflight"]],
            "artifacts": artifacts,
        }
        for platform in e.platforms:
            native = platform == "linux/amd64"
            lines = dict(cmd) if native else {**cmd, **_platform_lines(e, platform, project, cmd)}
            report = f"reports/{e.distro}-{e.target}" if native else lines["report"]
            arch = PLATFORMS[platform].oci_arch
            push = (
                'if [ "$CI_COMMIT_BRANCH" = "$CI_DEFAULT_BRANCH" ] && [ "$CI_PIPELINE_SOURCE" = push ]; then\n'
                + login
                + _push_lines(
                    e, platform, report, summary="digests.md", output=f"digest-{arch}.env", name=f"digest_{arch}"
                )
                + "fi\n"
            )
            script = [lines["base"], lines["fetch"], lines["build"]] + ([lines["smoke"]] if e.smoke else [])
            name = f"image:{e.distro}:{e.target}" + ("" if native else f":{arch}")
            job: GitlabJob = {
                "stage": "image",
                "extends": ".forge",
                "needs": [preflight],
                "timeout": f"{e.timeout_minutes}m",
                "variables": variables,
                "script": [*script, push],
                "artifacts": {
                    **artifacts,
                    "paths": [f"{report}/", "digests.md"],
                    "reports": {"dotenv": f"digest-{arch}.env"},
                },
            }
            if not native:
                job["tags"] = [*tags, arch]
            data[name] = job
        if len(e.platforms) > 1:
            needs = [
                f"image:{e.distro}:{e.target}" + ("" if p == "linux/amd64" else f":{PLATFORMS[p].oci_arch}")
                for p in e.platforms
            ]
            images = " ".join(f"{p}=$digest_{PLATFORMS[p].oci_arch}" for p in e.platforms)
            data[f"manifest:{e.distro}:{e.target}"] = {
                "stage": "manifest",
                "extends": ".forge",
                "needs": needs,
                "rules": [{"if": GITLAB_ON_MAIN}],
                "variables": variables,
                "script": [login, f"forge index {push_ref(e, None, '$FORGE_REGISTRY')} {images}\n"],
            }
    warmed = [e for e in matrix(project) if e.kind in WARMED_KINDS]
    if warmed:
        script = []
        for e in warmed:
            cmd = _command_lines(e, locked=locked, allow_incomplete=False)
            build = f"forge build {e.distro} {e.target} --quiet --skip-tests" + (" --locked" if locked else "")
            script.append(
                cmd["base"]
                + f"forge fetch {e.distro} {e.target}\n"
                + f'{build} || echo "warming {e.distro} {e.target} failed: the next pipeline builds it"\n'
            )
        data["warm-caches"] = {
            "stage": "warm",
            "extends": ".forge",
            "needs": [],
            "rules": [{"if": GITLAB_ON_MAIN}],
            "timeout": f"{TIMEOUT_MINUTES['source']}m",
            "variables": {"FORGE_CACHE_EXPORT": "1"},
            "script": script,
        }
    options = (
        (" " + " ".join(f"--gitlab-tag {t}" for t in tags) if tags else "")
        + (f" --registry {registry}" if registry != GITLAB_REGISTRY else "")
        + _options(locked, allow_incomplete)
    )
    return _dump(data, _header("gitlab", GITLAB_PATH, options))
