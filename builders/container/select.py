"""Which engine: `--engine docker|podman|auto` (FORGE_ENGINE when the flag is not given), decided once.

auto looks at what is there the way a user would: a DOCKER_HOST socket answering as Podman's API service is
Podman; a `docker` command that is Podman in disguise (Fedora's podman-docker) is Podman; a Docker daemon is
Docker; else a `podman` on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import cast, get_args

from builders.container.base import Engine, EngineChoice
from builders.container.docker_engine import DockerEngine, docker_host, is_podman_service, open_client
from builders.container.podman_engine import PodmanEngine
from builders.errors import EngineError, UsageError

ENV = "FORGE_ENGINE"
CHOICES: tuple[str, ...] = get_args(EngineChoice)


def chosen(choice: str | None = None) -> EngineChoice:
    """The CLI's one decision: `--engine` when given, else FORGE_ENGINE, else auto."""
    value = (choice or os.environ.get(ENV) or "auto").strip().lower()
    if value not in CHOICES:
        where = "--engine" if choice else ENV
        raise UsageError(f"{where}={value!r} is not an engine", hint=f"use one of {', '.join(CHOICES)}")
    return cast(EngineChoice, value)


def docker_cli_is_podman() -> bool:
    """Fedora's podman-docker installs a `docker` that runs podman; its --version says so."""
    path = shutil.which("docker")
    if path is None:
        return False
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.lower().startswith("podman")


def connect(choice: EngineChoice | None = None) -> Engine:
    """The engine `choice` names: docker, podman, or auto (whatever answers here); None: FORGE_ENGINE, else auto,
    read now (a command that connects no engine never reads FORGE_ENGINE)."""
    # Checked again: a caller outside the CLI (a test, a benchmark) may hand in any text.
    value = chosen(choice)
    if value == "podman":
        return PodmanEngine.open()
    if value == "docker":
        opened = open_client()
        if is_podman_service(opened[2]):
            raise EngineError(
                f"the engine at {docker_host()} is Podman's API service, not Docker: Podman's builds and "
                "secrets need its own CLI",
                hint="use --engine podman (or auto)",
            )
        return DockerEngine.open(opened)
    if os.environ.get("DOCKER_HOST"):
        opened = open_client()
        return PodmanEngine.open() if is_podman_service(opened[2]) else DockerEngine.open(opened)
    if docker_cli_is_podman():
        return PodmanEngine.open()
    try:
        opened = open_client()
    except EngineError as docker_error:
        if shutil.which("podman"):
            return PodmanEngine.open()
        raise EngineError(
            f"no container engine: {docker_error.message}; no podman on PATH",
            hint="start Docker (`dockerd --bridge=none --iptables=false`) or install Podman; .ci/engines does both",
        ) from docker_error
    return PodmanEngine.open() if is_podman_service(opened[2]) else DockerEngine.open(opened)
