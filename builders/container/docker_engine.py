"""Docker: containers and images through the Docker Engine API (the `docker` SDK), builds through BuildKit.

Podman serves a look-alike of this API on its socket, but not BuildKit's session endpoint nor build secrets
for a Docker client: Podman is its own engine (podman_engine.py), and select.py hands a socket that turns out
to be Podman's to it.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TypedDict

import docker
import docker.errors
import docker.types
import requests

from builders.container.base import Builder, Engine, EngineFacts, ImageInfo, RunSpec
from builders.errors import EngineError


def gpu_device_requests(gpus: bool) -> list[docker.types.DeviceRequest]:
    """Every GPU of the host, as `docker run --gpus all` asks for them (the NVIDIA container runtime answers)."""
    return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else []


def _volume_specs(volumes: dict[str, str]) -> dict[str, dict[str, str]]:
    """host path -> container path; read-only unless the container path ends in ':rw'."""
    specs = {}
    for host, target in volumes.items():
        path, _, mode = target.partition(":")
        specs[host] = {"bind": path, "mode": "rw" if mode == "rw" else "ro"}
    return specs


def docker_host() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


class DockerComponent(TypedDict, total=False):
    Name: str
    Version: str


class DockerVersion(TypedDict, total=False):
    """What Docker's `GET /version` answers, as far as Forge reads it."""

    Version: str
    ApiVersion: str
    Components: list[DockerComponent]


class DockerInfo(TypedDict, total=False):
    """What Docker's `GET /info` answers, as far as Forge reads it."""

    Name: str
    DockerRootDir: str
    DefaultRuntime: str
    CgroupVersion: str
    CgroupDriver: str
    SecurityOptions: list[str]


def open_client() -> tuple[Any, DockerInfo, DockerVersion]:
    """(client, info, version) of whatever answers at DOCKER_HOST; EngineError when nothing does."""
    try:
        client = docker.from_env(timeout=600)
        return client, client.info(), client.version()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise EngineError(
            f"no Docker engine answers at {docker_host()}: {exc}",
            hint="start Docker (`dockerd --bridge=none --iptables=false`, as .ci/engines does), "
            "or choose Podman with --engine podman",
        ) from exc


def is_podman_service(version: DockerVersion) -> bool:
    """Podman's API service names itself among the version's components; Docker's never does."""
    return any("podman" in str(c.get("Name", "")).lower() for c in version.get("Components") or [])


class DockerEngine(Engine):
    """Docker through its Engine API. Opened by `connect("docker")` (select.py)."""

    def __init__(self, client: Any, *, facts: EngineFacts) -> None:
        self.client = client
        self.facts = facts

    @classmethod
    def open(cls, opened: tuple[Any, DockerInfo, DockerVersion] | None = None) -> DockerEngine:
        """From open_client()'s answer, when the caller already has it."""
        client, info, version = opened or open_client()
        security = " ".join(str(o) for o in info.get("SecurityOptions") or [])
        return cls(
            client,
            facts=EngineFacts(
                kind="docker",
                version=str(version.get("Version", "unknown")),
                rootless="rootless" in security,
                root_dir=info.get("DockerRootDir") or str(info.get("Name", "")) or None,
                runtime=str(info.get("DefaultRuntime") or "") or None,
                cgroups=f"v{info.get('CgroupVersion', '?')} {info.get('CgroupDriver', '?')}",
            ),
        )

    def check(self) -> None:
        # Docker answered info and version: its containers have started here since CI began. What fails
        # later (a GPU runtime, a full disk) is named where it fails.
        return None

    def choose_builder(self, preference: str) -> Builder:
        from builders.container.image_builders import docker_builder

        return docker_builder(self, preference)

    # --- images -------------------------------------------------------------------------------------------

    def image_exists(self, ref: str) -> bool:
        try:
            self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return False
        return True

    def image_info(self, ref: str) -> ImageInfo:
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound as exc:
            raise EngineError(f"image {ref!r} is not in the engine") from exc
        attrs = image.attrs
        return ImageInfo(
            id=str(image.id),
            tags=tuple(image.tags),
            digests=tuple(attrs.get("RepoDigests") or ()),
            size=int(attrs.get("Size", 0)),
            labels=dict((attrs.get("Config") or {}).get("Labels") or {}),
            created=str(attrs.get("Created", "")),
        )

    def pull(self, ref: str, *, platform: str | None = None) -> str:
        """Pull a reference (a tag, or `name@sha256:…` for exactly that manifest); returns the local image id."""
        try:
            image = self.client.images.pull(ref, platform=platform)
        except docker.errors.APIError as exc:
            raise EngineError(f"could not pull {ref}: {exc.explanation or exc}") from exc
        return str(image.id)

    def push(self, ref: str) -> str:
        """Push a tagged image with the credentials the engine's client reads (~/.docker/config.json, or
        $DOCKER_CONFIG); returns the manifest digest the engine reports. The caller verifies it against the
        registry: an engine's word is not the registry's."""
        repo, _, tag = ref.rpartition(":")
        digest = ""
        try:
            for chunk in self.client.images.push(repo, tag=tag, stream=True, decode=True):
                if "error" in chunk:
                    detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
                    raise EngineError(f"the engine could not push {ref}: {detail}")
                digest = str((chunk.get("aux") or {}).get("Digest") or digest)
        except (docker.errors.APIError, requests.RequestException) as exc:
            raise EngineError(f"the engine could not push {ref}: {exc}") from exc
        if not digest.startswith("sha256:"):
            raise EngineError(f"the engine pushed {ref} but reported no manifest digest")
        return digest

    def image_platform(self, ref: str) -> str:
        """os/architecture of a local image, as the engine records it (an import says what it was told)."""
        attrs = self.client.images.get(ref).attrs
        return f"{attrs.get('Os', 'linux')}/{attrs.get('Architecture', '?')}"

    def tag(self, image_id: str, ref: str) -> None:
        repo, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
        self.client.images.get(image_id).tag(repo, tag)

    def untag(self, ref: str) -> None:
        with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
            self.client.images.remove(ref, noprune=False)

    def remove_image(self, ref: str) -> None:
        with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
            self.client.images.remove(ref, force=True)

    def prune_build_cache(self) -> None:
        # BuildKit's cache is driven through the CLI here, as its builds are (image_builders.py); the API's
        # prune covers dangling images.
        if shutil.which("docker"):
            subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True, timeout=600, check=False)
        with contextlib.suppress(docker.errors.APIError):
            self.client.images.prune(filters={"dangling": True})

    def save_stream(self, ref: str) -> IO[bytes]:
        try:
            image = self.client.images.get(ref)
            chunks: Iterator[bytes] = iter(image.save(named=False))
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise EngineError(
                f"cannot export image {ref!r}: {exc}", hint="is it in the engine? `docker images`"
            ) from exc
        return io.BufferedReader(_ChunkReader(chunks), buffer_size=1 << 20)

    def rootfs_layers(self, ref: str) -> tuple[str, ...]:
        try:
            attrs = self.client.images.get(ref).attrs
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise EngineError(f"image {ref!r} is not in the engine: {exc}") from exc
        return tuple(str(layer) for layer in (attrs.get("RootFS") or {}).get("Layers") or ())

    def load(self, tarball: bytes | Any) -> list[str]:
        images = self.client.images.load(tarball)
        return [str(i.id) for i in images]

    def import_rootfs(
        self, tar_path: str, ref: str, *, changes: list[str] | None = None, platform: str | None = None
    ) -> str:
        """Turn a rootfs tarball into an image, as `docker import` does.

        For another architecture than the engine's, Docker 20.10's import ignores its platform argument and
        records the host's amd64, so a build FROM the base for linux/arm64 would not find it. That base is made
        by the builder instead (FROM scratch, ADD the tarball), which records the platform asked for."""
        repo, _, tag = ref.rpartition(":")
        if platform and platform != self.native_platform:
            return self._rootfs_by_build(Path(tar_path), ref, changes or [], platform)
        with Path(tar_path).open("rb") as fh:
            resp = self.client.api.import_image_from_data(fh, repository=repo, tag=tag, changes=changes)
        return str(resp)

    @property
    def native_platform(self) -> str:
        info = self.client.info()
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(str(info.get("Architecture")), "amd64")
        return f"linux/{arch}"

    def _rootfs_by_build(self, tar: Path, ref: str, changes: list[str], platform: str) -> str:
        with tempfile.TemporaryDirectory(prefix="forge-rootfs-", dir=tar.parent) as tmp:
            folder = Path(tmp)
            try:
                os.link(tar, folder / "rootfs.tar")
            except OSError:
                shutil.copy2(tar, folder / "rootfs.tar")
            (folder / "Containerfile").write_text(
                "FROM scratch\nADD rootfs.tar /\n" + "".join(f"{c}\n" for c in changes)
            )
            image_id = ""
            try:
                for chunk in self.client.api.build(
                    path=str(folder),
                    dockerfile="Containerfile",
                    tag=ref,
                    platform=platform,
                    rm=True,
                    forcerm=True,
                    decode=True,
                ):
                    if "error" in chunk:
                        raise EngineError(f"could not make {ref} for {platform}: {chunk['error']}")
                    image_id = str((chunk.get("aux") or {}).get("ID") or image_id)
            except docker.errors.APIError as exc:
                raise EngineError(f"could not make {ref} for {platform}: {exc.explanation or exc}") from exc
        return image_id

    # --- containers ---------------------------------------------------------------------------------------

    def run_detached(self, spec: RunSpec) -> str:
        name = spec.container_name()
        try:
            container = self.client.containers.run(
                spec.image,
                command=spec.command,
                name=name,
                environment=spec.env,
                volumes=_volume_specs(spec.volumes),
                network_mode="host" if spec.network_host else "none",
                shm_size=spec.shm_size,
                labels=spec.all_labels(),
                entrypoint=spec.entrypoint,
                user=spec.user,
                device_requests=gpu_device_requests(spec.gpus) or None,
                cpuset_cpus=spec.cpuset_cpus,
                detach=True,
            )
        except docker.errors.APIError as exc:
            # run is create + start: a start refused (no GPU runtime) leaves a created container behind. A name
            # conflict (409) is someone else's container: leave it.
            if exc.status_code != 409:
                self.stop_and_remove(name, timeout=0)
            hint = (
                "install the NVIDIA Container Toolkit and register its runtime with the engine "
                "(`nvidia-ctk runtime configure`), then restart the engine"
                if spec.gpus
                else None
            )
            raise EngineError(
                f"could not start a container from {spec.image}{' with the host GPUs' if spec.gpus else ''}: "
                f"{exc.explanation or exc}",
                hint=hint,
            ) from exc
        return str(container.id)

    def stop_and_remove(self, cid: str, timeout: int = 5) -> None:
        try:
            container = self.client.containers.get(cid)
        except docker.errors.NotFound:
            return
        with contextlib.suppress(docker.errors.APIError):
            container.stop(timeout=timeout)
        with contextlib.suppress(docker.errors.APIError, docker.errors.NotFound):
            container.remove(force=True)

    def kill(self, cid: str) -> None:
        with contextlib.suppress(docker.errors.APIError, docker.errors.NotFound):
            self.client.containers.get(cid).kill()

    def is_running(self, cid: str) -> bool:
        try:
            return str(self.client.containers.get(cid).status) == "running"
        except docker.errors.NotFound:
            return False

    def logs(self, cid: str, tail: int = 200) -> str:
        try:
            return bytes(self.client.containers.get(cid).logs(tail=tail)).decode(errors="replace")
        except docker.errors.NotFound:
            return ""

    def run_once(self, spec: RunSpec, *, timeout: float = 300) -> tuple[int, str]:
        cid = self.run_detached(spec.throwaway())
        container = self.client.containers.get(cid)
        try:
            try:
                result = container.wait(timeout=timeout)
            except requests.exceptions.ConnectionError as exc:
                raise EngineError(f"{spec.image} did not finish {spec.command[:3]} within {timeout:.0f}s") from exc
            output = bytes(container.logs()).decode(errors="replace")
            return int(result.get("StatusCode", 1)), output
        finally:
            self.stop_and_remove(cid, timeout=1)

    def containers_with_label(self, key: str, value: str | None = None) -> list[str]:
        selector = f"{key}={value}" if value is not None else key
        return [str(c.id) for c in self.client.containers.list(all=True, filters={"label": selector})]

    def all_containers(self) -> dict[str, str]:
        return {str(c.id): str(c.status) for c in self.client.containers.list(all=True)}


class _ChunkReader(io.RawIOBase):
    """A file over the chunks the engine streams, so tarfile can read the export without a temp copy."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size
