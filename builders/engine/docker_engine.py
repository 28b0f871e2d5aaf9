"""Containers and images through the Docker Engine API (the `docker` SDK).

Podman serves the same API on its socket (`DOCKER_HOST=unix:///run/podman/podman.sock`), so one code path
covers both engines.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
import requests

from builders.errors import EngineError

# Every container Forge starts carries this label, so a cleanup can find what a crashed run left behind.
OWNER_LABEL = "forge.owner"


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    digests: tuple[str, ...]
    size: int
    labels: dict[str, str]
    created: str


def gpu_device_requests(gpus: bool) -> list[docker.types.DeviceRequest]:
    """Every GPU of the host, as `docker run --gpus all` asks for them (the NVIDIA container runtime answers)."""
    return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else []


def _volume_specs(volumes: dict[str, str] | None) -> dict[str, dict[str, str]]:
    """host path -> container path; read-only unless the container path ends in ':rw'."""
    specs = {}
    for host, target in (volumes or {}).items():
        path, _, mode = target.partition(":")
        specs[host] = {"bind": path, "mode": "rw" if mode == "rw" else "ro"}
    return specs


class Engine:
    """A connected engine. Construct with `Engine.connect()`."""

    def __init__(self, client: Any, *, kind: str, root_dir: str | None, version: str) -> None:
        self.client = client
        self.kind = kind
        self.root_dir = root_dir
        self.version = version

    @classmethod
    def connect(cls) -> Engine:
        try:
            client = docker.from_env(timeout=600)
            info = client.info()
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise EngineError(
                f"no container engine answers at {os.environ.get('DOCKER_HOST', 'unix:///var/run/docker.sock')}: {exc}",
                hint="start Docker (`dockerd --bridge=none --iptables=false`) or Podman's API service "
                "(`podman system service`) and set DOCKER_HOST to its socket",
            ) from exc
        name = str(info.get("Name", ""))
        version = client.version()
        components = {c.get("Name", "").lower() for c in version.get("Components", [])}
        kind = "podman" if any("podman" in c for c in components) else "docker"
        return cls(
            client,
            kind=kind,
            root_dir=info.get("DockerRootDir") or name or None,
            version=str(version.get("Version", "unknown")),
        )

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

    def run_detached(
        self,
        *,
        image: str,
        command: list[str],
        name: str | None = None,
        env: dict[str, str] | None = None,
        volumes: dict[str, str] | None = None,
        network_host: bool = True,
        shm_size: str = "2g",
        labels: dict[str, str] | None = None,
        entrypoint: list[str] | None = None,
        user: str | None = None,
        gpus: bool = False,
        cpuset_cpus: str | None = None,
    ) -> str:
        """Start a long-lived container; the caller must `stop_and_remove` it. gpus: hand it every host GPU;
        cpuset_cpus: confine it to these host CPUs ('0-1', '2,3')."""
        all_labels = {OWNER_LABEL: "forge", **(labels or {})}
        name = name or f"forge-{uuid.uuid4().hex[:10]}"
        try:
            container = self.client.containers.run(
                image,
                command=command,
                name=name,
                environment=env or {},
                volumes=_volume_specs(volumes),
                network_mode="host" if network_host else "none",
                shm_size=shm_size,
                labels=all_labels,
                entrypoint=entrypoint,
                user=user,
                device_requests=gpu_device_requests(gpus) or None,
                cpuset_cpus=cpuset_cpus,
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
                if gpus
                else None
            )
            raise EngineError(
                f"could not start a container from {image}{' with the host GPUs' if gpus else ''}: "
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

    def run_once(
        self,
        image: str,
        command: list[str],
        *,
        entrypoint: list[str] | None = None,
        env: dict[str, str] | None = None,
        volumes: dict[str, str] | None = None,
        network_host: bool = True,
        timeout: float = 300,
        user: str | None = None,
        shm_size: str = "1g",
        gpus: bool = False,
    ) -> tuple[int, str]:
        """Run a throwaway container to completion; it is removed whatever happens."""
        cid = self.run_detached(
            image=image,
            command=command,
            env=env,
            volumes=volumes,
            network_host=network_host,
            entrypoint=entrypoint,
            user=user,
            shm_size=shm_size,
            labels={"forge.throwaway": "1"},
            gpus=gpus,
        )
        container = self.client.containers.get(cid)
        try:
            try:
                result = container.wait(timeout=timeout)
            except requests.exceptions.ConnectionError as exc:
                raise EngineError(f"{image} did not finish {command[:3]} within {timeout:.0f}s") from exc
            output = bytes(container.logs()).decode(errors="replace")
            return int(result.get("StatusCode", 1)), output
        finally:
            self.stop_and_remove(cid, timeout=1)

    def containers_with_label(self, key: str, value: str | None = None) -> list[str]:
        selector = f"{key}={value}" if value is not None else key
        return [str(c.id) for c in self.client.containers.list(all=True, filters={"label": selector})]
