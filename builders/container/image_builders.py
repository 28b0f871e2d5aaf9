"""Docker's image builders: BuildKit through a Docker CLI that has it, or the engine API's legacy builder.
(Podman's, buildah through `podman build`, lives with its engine in podman_engine.py.)

BuildKit is preferred because it has cache mounts (a compiler cache that survives between builds) and build
secrets (a CA bundle that never lands in a layer). The Docker SDK's build call is the legacy builder, which
has neither; a template rendered for it stages secrets in a build stage the final image does not copy from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, get_args

from builders import interrupt
from builders.container.base import Builder, BuilderChoice, BuildRequest, BuildResult, LayerCache, LineSink
from builders.errors import EngineError
from builders.redact import mask_urls

if TYPE_CHECKING:
    from builders.container.base import Engine

__all__ = ["BuildRequest", "BuildResult", "Builder", "LineSink", "choose_builder", "describe", "stream_build"]


class _DockerClient(Protocol):
    """What the legacy builder needs of Docker's engine (docker_engine.DockerEngine): its SDK client."""

    client: Any


# Debian's docker.io client (20.10) still speaks BuildKit with DOCKER_BUILDKIT=1; a newer static client earlier
# on PATH may lack buildx and fall back to the legacy builder silently, so look for one that has it.
CLI_CANDIDATES = ("/usr/bin/docker", "/usr/local/bin/docker", "docker")


def _buildkit_cli() -> str | None:
    for candidate in CLI_CANDIDATES:
        path = shutil.which(candidate) if "/" not in candidate else (candidate if Path(candidate).exists() else None)
        if path is None:
            continue
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        probe = subprocess.run([path, "build", "--help"], capture_output=True, text=True, env=env, check=False)
        if "--secret" in probe.stdout and "buildx" not in probe.stderr.lower():
            # A client whose `build` is buildx without the buildx plugin prints a warning and uses legacy.
            version = subprocess.run([path, "buildx", "version"], capture_output=True, text=True, check=False)
            legacy_fallback = version.returncode != 0 and _is_buildx_default(path)
            if not legacy_fallback:
                return path
    return None


def _is_buildx_default(path: str) -> bool:
    """Docker clients from 23.0 on route `docker build` to buildx; without the plugin they fall back to legacy."""
    out = subprocess.run(
        [path, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True, check=False
    ).stdout.strip()
    match = re.match(r"(\d+)\.", out)
    return bool(match and int(match.group(1)) >= 23)


class BuildKitCliBuilder:
    name = "buildkit"
    supports_secrets = True
    supports_cache_mounts = True
    layer_cache: LayerCache = "inline"
    version: str | None = None

    def __init__(self, cli: str) -> None:
        self.cli = cli

    def build(self, request: BuildRequest, sink: LineSink) -> BuildResult:
        with tempfile.TemporaryDirectory(prefix="forge-iid-") as tmp:
            iidfile = Path(tmp) / "iid"
            cmd = [
                self.cli,
                "build",
                "--progress=plain",
                "--iidfile",
                str(iidfile),
                "-f",
                str(request.containerfile),
            ]
            if request.network_host:
                cmd += ["--network", "host"]
            if request.target:
                cmd += ["--target", request.target]
            if request.platform:
                cmd += ["--platform", request.platform]
            if request.no_cache:
                cmd.append("--no-cache")
            for ref in request.cache_from:
                cmd += ["--cache-from", ref]
            if request.cache_to:
                # No buildx here: the only export is the inline cache, which a later push of this image carries.
                cmd += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
            cmd += request.cli_flags()
            env = {**os.environ, "DOCKER_BUILDKIT": "1", "BUILDKIT_PROGRESS": "plain"}
            start = time.monotonic()
            rc, step_times = _stream(cmd, env, request.log_path, sink)
            return BuildResult.from_run(
                builder=self.name,
                returncode=rc,
                iidfile=iidfile,
                seconds=time.monotonic() - start,
                log_path=request.log_path,
                step_times=step_times,
            )


def stream_build(cmd: list[str], env: dict[str, str], log_path: Path | None, sink: LineSink) -> int:
    """Run a build command, teeing each line to the sink and the log; a Ctrl-C stops it. Returns its exit code."""
    return _stream(cmd, env, log_path, sink)[0]


_STEP_DONE = re.compile(r"^#\d+ \[(?P<stage>[\w.-]+) +\d+/\d+\].*|^#\d+ DONE (?P<secs>[\d.]+)s")


def _stream(cmd: list[str], env: dict[str, str], log_path: Path | None, sink: LineSink) -> tuple[int, dict[str, float]]:
    """Run a build command, teeing each line to the sink and the log; returns rc and seconds per stage."""
    step_times: dict[str, float] = {}
    current: str | None = None
    log = log_path.open("w", encoding="utf-8", buffering=1) if log_path else None
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            errors="replace",
            bufsize=1,
        )
        assert proc.stdout is not None
        # A second signal does not wait for BuildKit to wind down: the client dies at once, and the solve with it.
        with interrupt.on_second_signal(proc.kill):
            try:
                for line in proc.stdout:
                    if log:
                        log.write(mask_urls(line))
                    sink(line.rstrip("\n"))
                    match = _STEP_DONE.match(line)
                    if match and match.group("stage"):
                        current = match.group("stage")
                    elif match and match.group("secs") and current:
                        step_times[current] = step_times.get(current, 0.0) + float(match.group("secs"))
                rc = proc.wait()
            except BaseException:
                # Ctrl-C, SIGTERM or a crash in the sink: stop the client so BuildKit cancels the solve and
                # leaves nothing.
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                raise
    finally:
        if log:
            log.close()
    return rc, step_times


class LegacySdkBuilder:
    name = "legacy"
    supports_secrets = False
    supports_cache_mounts = False
    layer_cache: LayerCache = "none"
    version: str | None = None

    def __init__(self, engine: _DockerClient) -> None:
        self.engine = engine

    def build(self, request: BuildRequest, sink: LineSink) -> BuildResult:
        start = time.monotonic()
        image_id: str | None = None
        rc = 0
        log = request.log_path.open("w", encoding="utf-8", buffering=1) if request.log_path else None
        try:
            stream = self.engine.client.api.build(
                path=str(request.context_dir),
                dockerfile=str(request.containerfile.relative_to(request.context_dir))
                if request.containerfile.is_relative_to(request.context_dir)
                else str(request.containerfile),
                target=request.target,
                buildargs=request.build_args,
                labels=request.labels,
                network_mode="host" if request.network_host else None,
                nocache=request.no_cache,
                platform=request.platform,
                rm=True,
                forcerm=True,  # a failed step's container is removed too: nothing stray is left
                decode=True,
            )
            for chunk in stream:
                text = str(chunk.get("stream") or chunk.get("status") or "")
                if "error" in chunk:
                    text = f"ERROR: {chunk['error']}\n"
                    rc = 1
                if "aux" in chunk and "ID" in chunk["aux"]:
                    image_id = str(chunk["aux"]["ID"])
                for line in text.splitlines():
                    if log:
                        log.write(mask_urls(line) + "\n")
                    sink(line)
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM: the engine cancels a legacy build when its connection closes; drop it now rather
            # than when this process exits, which may be after a long cleanup.
            self.engine.client.api.close()
            raise
        except Exception as exc:  # the SDK raises several unrelated types for one failed build
            if log:
                log.write(mask_urls(f"ERROR: {exc}\n"))
            sink(f"ERROR: {exc}")
            rc = 1
        finally:
            if log:
                log.close()
        ok = rc == 0 and image_id is not None
        return BuildResult(
            ok=ok,
            image_id=image_id if ok else None,
            builder=self.name,
            seconds=time.monotonic() - start,
            log_path=request.log_path,
            returncode=rc,
        )


def choose_builder(engine: Engine, preference: str = "auto") -> Builder:
    """The engine's builder for `preference` (--builder): each engine knows its own."""
    if preference not in get_args(BuilderChoice):
        raise EngineError(f"unknown builder {preference!r}", hint=f"use one of {', '.join(get_args(BuilderChoice))}")
    return engine.choose_builder(preference)


def docker_builder(engine: _DockerClient, preference: str) -> Builder:
    """Pick Docker's builder deliberately: BuildKit when a client offers it, else the legacy API builder."""
    if preference == "buildah":
        raise EngineError(
            "--builder buildah is Podman's builder, and the engine here is Docker", hint="use --engine podman"
        )
    if preference in {"auto", "buildkit"}:
        cli = _buildkit_cli()
        if cli:
            return BuildKitCliBuilder(cli)
        if preference == "buildkit":
            raise EngineError(
                "no Docker CLI with BuildKit was found",
                hint="install Debian's docker.io (its /usr/bin/docker speaks BuildKit with DOCKER_BUILDKIT=1) "
                "or the buildx plugin, or build with --builder legacy",
            )
    return LegacySdkBuilder(engine)


def describe(builder: Builder) -> dict[str, object]:
    return {
        "name": builder.name,
        "secrets": builder.supports_secrets,
        "cache_mounts": builder.supports_cache_mounts,
        "layer_cache": builder.layer_cache,
        "cli": getattr(builder, "cli", None),
        "version": builder.version,
    }


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
