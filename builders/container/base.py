"""The Engine interface: what Forge asks of a container engine, whichever one answers.

One module per engine implements it (docker_engine.py over the Docker Engine API, podman_engine.py over the
`podman` CLI); `connect(choice)` in select.py (builders.container.connect) opens the one the CLI chose from
`--engine` / FORGE_ENGINE. No code
outside builders/container/ asks which engine it has: what differs is a capability, recorded once in `facts`.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Literal, Protocol

LineSink = Callable[[str], None]

# --builder: auto takes the engine's best (Docker: BuildKit when a client offers it, else the legacy API builder;
# Podman: buildah through `podman build`). Declared here, below the options that offer it, because each engine
# knows its own builders.
BuilderChoice = Literal["auto", "buildkit", "legacy", "buildah"]

# --engine: auto finds what is there (select.py). The CLI resolves it once, FORGE_ENGINE its default, and passes it
# down to the one `connect` of the command.
EngineChoice = Literal["auto", "docker", "podman"]


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    context_dir: Path
    containerfile: Path
    target: str | None = None
    build_args: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, Path] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    network_host: bool = True
    no_cache: bool = False
    log_path: Path | None = None
    # linux/arm64 on an x86_64 host runs each RUN under qemu-user-static (binfmt_misc); None: the engine's own.
    platform: str | None = None
    # A registry layer cache (builders/cache/layers.py), spelled by each builder its own way (Builder.layer_cache):
    # buildah takes one repository both ways; BuildKit imports images and, with cache_to set, embeds an inline cache.
    cache_from: tuple[str, ...] = ()
    cache_to: str | None = None

    def cli_flags(self) -> list[str]:
        """The flags `docker build` and `podman build` spell alike, sorted so the same request gives the same
        command line (and the log diff between two builds shows only what changed)."""
        flags: list[str] = []
        for key, value in sorted(self.build_args.items()):
            flags += ["--build-arg", f"{key}={value}"]
        for key, path in sorted(self.secrets.items()):
            flags += ["--secret", f"id={key},src={path}"]
        for key, value in sorted(self.labels.items()):
            flags += ["--label", f"{key}={value}"]
        return [*flags, str(self.context_dir)]


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    ok: bool
    image_id: str | None
    builder: str
    seconds: float
    log_path: Path | None
    returncode: int
    step_times: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_run(
        cls,
        *,
        builder: str,
        returncode: int,
        iidfile: Path,
        seconds: float,
        log_path: Path | None,
        step_times: dict[str, float] | None = None,
    ) -> BuildResult:
        """A CLI build's outcome: it succeeded only if it exited 0 *and* wrote the image ID it was asked for."""
        image_id = iidfile.read_text().strip() if returncode == 0 and iidfile.exists() else None
        return cls(
            ok=returncode == 0 and bool(image_id),
            image_id=image_id,
            builder=builder,
            seconds=seconds,
            log_path=log_path,
            returncode=returncode,
            step_times=step_times or {},
        )


# How a builder shares layers through a registry: buildah pushes and pulls each step itself (`registry`), BuildKit
# without buildx embeds an inline cache in the images it builds (`inline`), the legacy builder does neither.
LayerCache = Literal["registry", "inline", "none"]


class Builder(Protocol):
    name: str
    supports_secrets: bool
    supports_cache_mounts: bool
    layer_cache: LayerCache
    version: str | None

    def build(self, request: BuildRequest, sink: LineSink) -> BuildResult: ...


# Every container Forge starts carries this label, so a cleanup can find what a crashed run left behind.
OWNER_LABEL = "forge.owner"


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """A container to run, whichever engine runs it: `run_detached` starts it, `run_once` runs it to completion."""

    image: str
    command: list[str]
    name: str | None = None  # None: forge-<random>
    env: dict[str, str] = field(default_factory=dict)
    # host path -> container path, read-only unless the container path ends in ':rw'
    volumes: dict[str, str] = field(default_factory=dict)
    network_host: bool = True  # False: no network at all
    shm_size: str = "2g"
    labels: dict[str, str] = field(default_factory=dict)  # OWNER_LABEL is added to every container
    entrypoint: list[str] | None = None
    user: str | None = None
    gpus: bool = False  # hand it every host GPU
    cpuset_cpus: str | None = None  # confine it to these host CPUs ('0-1', '2,3')

    def container_name(self) -> str:
        return self.name or f"forge-{uuid.uuid4().hex[:10]}"

    def all_labels(self) -> dict[str, str]:
        return {OWNER_LABEL: "forge", **self.labels}

    def throwaway(self) -> RunSpec:
        """This spec as `run_once` starts it: named, so it can be removed whatever happens, and labelled as such."""
        return replace(self, name=self.container_name(), labels={**self.labels, "forge.throwaway": "1"})


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    digests: tuple[str, ...]
    size: int
    labels: dict[str, str]
    created: str


@dataclass(frozen=True, kw_only=True)
class EngineFacts:
    """What the engine is and can do, read once when it is connected; the build report records it."""

    kind: str  # docker | podman
    version: str
    rootless: bool = False
    root_dir: str | None = None  # where layers live: preflight's disk gate reads it
    scratch_dirs: tuple[str, ...] = ()  # where the builder stages (buildah: /var/tmp unless TMPDIR)
    runtime: str | None = None  # the OCI runtime (runc, crun)
    cgroups: str | None = None  # "v1 cgroupfs", "v2 systemd"
    builder_version: str | None = None  # Podman: the buildah its `podman build` is
    capabilities: dict[str, bool] = field(default_factory=dict)

    def describe(self) -> str:
        parts = ["rootless" if self.rootless else "rootful"]
        parts += [p for p in (self.runtime, f"cgroups {self.cgroups}" if self.cgroups else None) if p]
        return f"{self.kind} {self.version} ({', '.join(parts)})"

    def as_report(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "version": self.version,
            "rootless": self.rootless,
            "root_dir": self.root_dir,
            "scratch_dirs": list(self.scratch_dirs),
            "runtime": self.runtime,
            "cgroups": self.cgroups,
            "builder_version": self.builder_version,
            "capabilities": dict(self.capabilities),
        }


class Engine(ABC):
    """A connected engine. Open one with `connect(choice)` (select.py): this module cannot, since each engine's
    module imports it."""

    facts: EngineFacts

    @property
    def kind(self) -> str:
        return self.facts.kind

    @property
    def version(self) -> str:
        return self.facts.version

    @property
    def root_dir(self) -> str | None:
        return self.facts.root_dir

    def qualify(self, ref: str) -> str:
        """The name this engine stores `ref` under (Podman: fully qualified); Docker keeps short names."""
        return ref

    @abstractmethod
    def check(self) -> None:
        """Prove a container can start; raise EngineError naming the reason and the remedy when one cannot."""

    @abstractmethod
    def choose_builder(self, preference: str) -> Builder: ...

    # --- images -------------------------------------------------------------------------------------------

    @abstractmethod
    def image_exists(self, ref: str) -> bool: ...

    @abstractmethod
    def image_info(self, ref: str) -> ImageInfo: ...

    @abstractmethod
    def pull(self, ref: str, *, platform: str | None = None) -> str:
        """Pull a reference (a tag, or `name@sha256:…` for exactly that manifest); returns the local image id."""

    @abstractmethod
    def push(self, ref: str) -> str:
        """Push a tagged image with the credentials the engine's own client reads; returns the manifest digest the
        engine reports. The caller verifies it against the registry: an engine's word is not the registry's."""

    @abstractmethod
    def image_platform(self, ref: str) -> str:
        """os/architecture of a local image, as the engine records it (an import says what it was told)."""

    @property
    @abstractmethod
    def native_platform(self) -> str:
        """linux/amd64 or linux/arm64: what the engine's host runs without emulation."""

    @abstractmethod
    def tag(self, image_id: str, ref: str) -> None: ...

    @abstractmethod
    def untag(self, ref: str) -> None: ...

    @abstractmethod
    def remove_image(self, ref: str) -> None: ...

    @abstractmethod
    def load(self, tarball: bytes | Any) -> list[str]: ...

    @abstractmethod
    def prune_build_cache(self) -> None:
        """Drop the engine's build cache and dangling images: the copy of every built layer a build leaves besides
        the image, which a small disk cannot hold for long (the tests reclaim it after an image's last use)."""

    @abstractmethod
    def import_rootfs(
        self, tar_path: str, ref: str, *, changes: list[str] | None = None, platform: str | None = None
    ) -> str:
        """Turn a rootfs tarball into an image, as `docker import` does, recorded as `platform` (default: the
        engine's own)."""

    @abstractmethod
    def save_stream(self, ref: str) -> IO[bytes]:
        """The image as a docker-archive tar (manifest.json, config, one tar per layer), streamed."""

    @abstractmethod
    def rootfs_layers(self, ref: str) -> tuple[str, ...]:
        """The image's layer diff_ids: the engine's content hashes of each uncompressed layer."""

    # --- containers ---------------------------------------------------------------------------------------

    @abstractmethod
    def run_detached(self, spec: RunSpec) -> str:
        """Start a long-lived container; the caller must `stop_and_remove` it."""

    @abstractmethod
    def stop_and_remove(self, cid: str, timeout: int = 5) -> None: ...

    @abstractmethod
    def kill(self, cid: str) -> None: ...

    @abstractmethod
    def is_running(self, cid: str) -> bool: ...

    @abstractmethod
    def logs(self, cid: str, tail: int = 200) -> str: ...

    @abstractmethod
    def run_once(self, spec: RunSpec, *, timeout: float = 300) -> tuple[int, str]:
        """Run a throwaway container to completion (exit code, output); it is removed whatever happens."""

    @abstractmethod
    def containers_with_label(self, key: str, value: str | None = None) -> list[str]: ...

    @abstractmethod
    def all_containers(self) -> dict[str, str]:
        """Every container of the engine, Forge's or not: id -> status (created, running, exited …)."""
