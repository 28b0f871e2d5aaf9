"""Podman, driven through its own CLI the way its users drive it: `podman run`, `podman build` (buildah), `podman
save`. No API service is needed, and a non-root user's `podman` is rootless Podman with its own storage.

Podman stores images under fully qualified names: Forge's own (`forge/...`) live as `localhost/forge/...`, any
other short name as Docker Hub's (`docker.io/library/debian:12`), so every Forge command finds what another made.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, TypedDict

from packaging.version import InvalidVersion, Version

from builders.container.base import Engine, EngineFacts, ImageInfo, LayerCache, RunSpec
from builders.container.image_builders import Builder, BuildRequest, BuildResult, LineSink, stream_build
from builders.errors import EngineError

# Buildah learnt `RUN --mount=type=secret` in 1.23 and `--mount=type=cache` in 1.24: the BuildKit-style template
# (secrets, cache mounts, a bind-mounted wheelhouse) needs both; an older buildah gets the legacy template.
MOUNTS_SINCE = Version("1.24")
IMAGE_ID = re.compile(r"(sha256:)?[0-9a-f]{12,64}")


# buildah names a stage's container after its base, with -N when the name is taken.
_WORKING_CONTAINER = re.compile(r"-working-container(?:-\d+)?$")


def qualify(ref: str) -> str:
    """The fully qualified name Podman stores `ref` under; image IDs stay as they are."""
    if IMAGE_ID.fullmatch(ref):
        return ref
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return ref
    if first == "forge":
        return f"localhost/{ref}"
    return f"docker.io/{ref}" if rest else f"docker.io/library/{ref}"


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


class _ImageConfig(TypedDict, total=False):
    Labels: dict[str, str] | None


class _RootFs(TypedDict, total=False):
    Layers: list[str]


class PodmanImage(TypedDict, total=False):
    """One image of `podman image inspect --format json`, as far as Forge reads it (Podman's JSON, not Forge's)."""

    Id: str
    RepoTags: list[str] | None
    RepoDigests: list[str] | None
    Size: int
    Created: str
    Os: str
    Architecture: str
    Labels: dict[str, str] | None
    Config: _ImageConfig | None
    RootFS: _RootFs | None


def facts_from_info(info: dict[str, Any]) -> EngineFacts:
    """EngineFacts from `podman info -f json`."""
    host, store = info.get("host") or {}, info.get("store") or {}
    rootless = bool((host.get("security") or {}).get("rootless"))
    buildah = str(host.get("buildahVersion") or "")
    mounts = (_version(buildah) or Version("0")) >= MOUNTS_SINCE
    cgroup_version = str(host.get("cgroupVersion") or "?")
    controllers = set(host.get("cgroupControllers") or [])
    # Rootless Podman on cgroups v1 cannot confine anything; on v2 only the controllers delegated to the user.
    cpuset = "cpuset" in controllers and not (rootless and cgroup_version == "v1")
    # Rootless without a subuid range maps one UID only: a base whose files have other owners cannot be stored.
    uidmap = (host.get("idMappings") or {}).get("uidmap") or []
    subids = not rootless or any(int(m.get("size", 0)) > 1 for m in uidmap)
    return EngineFacts(
        kind="podman",
        version=str((info.get("version") or {}).get("Version") or "unknown"),
        rootless=rootless,
        root_dir=str(store.get("graphRoot") or "") or None,
        # buildah stages layers and copies in TMPDIR, else containers.conf's image_copy_tmp_dir (/var/tmp).
        scratch_dirs=(os.environ.get("TMPDIR") or str(store.get("imageCopyTmpDir") or "/var/tmp"),),
        runtime=str((host.get("ociRuntime") or {}).get("name") or "") or None,
        cgroups=f"{cgroup_version} {host.get('cgroupManager') or '?'}",
        builder_version=buildah or None,
        capabilities={"secrets": mounts, "cache_mounts": mounts, "cpuset": cpuset, "subids": subids},
    )


# What a container start that failed says, and what to do about it: (pattern, reason, remedy).
START_FAILURES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"setting rlimit type (\d+): operation not permitted|setrlimit .*operation not permitted", re.I),
        "the runtime was asked for rlimits above this host's hard limits (nofile or nproc), and this root "
        "may not raise them (no CAP_SYS_RESOURCE)",
        "pin them to the host's hard limits in containers.conf: "
        '[containers] default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=N:N"] with N at most '
        "`ulimit -Hu` and /proc/sys/kernel/pid_max (.ci/engines writes this)",
    ),
    (
        re.compile(r"cgroups in hybrid mode not supported|crun: .*cgroup", re.I),
        "crun cannot place containers in this host's cgroups (hybrid v1 + v2 hierarchy)",
        'use runc: [engine] runtime = "runc" in containers.conf (.ci/engines writes this), with runc installed',
    ),
    (
        re.compile(r"insufficient UIDs or GIDs|no sub[ug]id ranges|cannot find UID/GID|newuidmap|newgidmap", re.I),
        "rootless Podman found no subordinate UID/GID range for this user",
        "add one: `usermod --add-subuids 100000-165535 --add-subgids 100000-165535 $USER` (as root), install "
        "uidmap (newuidmap), then `podman system migrate`",
    ),
    (
        re.compile(r"default OCI runtime \"?(\w+)\"? not found|no valid executable found for OCI runtime", re.I),
        "the configured OCI runtime is not installed",
        'install runc (apt-get install runc) and set [engine] runtime = "runc" in containers.conf',
    ),
    (
        re.compile(r"cpuset.*(not|no such|permission|delegat)|cgroup.*cpuset", re.I),
        "the cpuset controller is not delegated to this user",
        "delegate it (systemd: Delegate=cpuset in user@.service.d) or run rootful; without it pools share CPUs",
    ),
)


def explain_start_failure(output: str) -> tuple[str, str]:
    """(reason, remedy) for a container start's error output; the output itself when nothing matches."""
    for pattern, reason, remedy in START_FAILURES:
        if pattern.search(output):
            return reason, remedy
    last = next((line for line in reversed(output.strip().splitlines()) if line.strip()), "no output")
    return last.strip(), "run `podman --log-level=debug run --rm IMAGE true` and read the runtime's error"


class PodmanEngine(Engine):
    """Podman through its CLI. Opened by `connect("podman")` (select.py)."""

    def __init__(self, cli: str, *, facts: EngineFacts) -> None:
        self.cli = cli
        self.facts = facts

    @classmethod
    def open(cls, cli: str = "podman") -> PodmanEngine:
        path = shutil.which(cli)
        if path is None:
            raise EngineError(
                "podman is not installed", hint="apt-get install podman runc uidmap (or dnf install podman)"
            )
        proc = subprocess.run([path, "info", "--format", "json"], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            reason, remedy = explain_start_failure(proc.stderr)
            raise EngineError(f"`podman info` failed: {reason}", hint=remedy)
        return cls(path, facts=facts_from_info(json.loads(proc.stdout)))

    def qualify(self, ref: str) -> str:
        return qualify(ref)

    def _run(self, *args: str, timeout: float | None = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.cli, *args], capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise EngineError(f"podman {args[0]} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def check(self) -> None:
        """Start one container from a one-file rootfs (a static binary of the host): runtime, cgroups, rlimits
        and ID mapping are all exercised before any image exists, in about a second."""
        if not self.facts.capabilities.get("subids", True):
            user = os.environ.get("USER") or str(os.getuid())
            reason, remedy = explain_start_failure("no subuid ranges")
            raise EngineError(
                f"rootless Podman for user {user} has no subordinate UID/GID range in /etc/subuid and /etc/subgid: "
                "every base image has files of other owners (/etc/gshadow is group shadow), which cannot be stored",
                hint=remedy,
            )
        static = next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "/bin/busybox") if Path(p).exists()), None)
        if static is None:  # no static binary to start: the base's first container will say what is wrong
            return
        with tempfile.TemporaryDirectory(prefix="forge-engine-check-") as root:
            shutil.copy2(static, Path(root) / "probe")
            Path(root).chmod(0o755)
            proc = self._run(
                "run", "--rm", "--network", "host", "--rootfs", root, "/probe", "--version", timeout=120, check=False
            )
        if proc.returncode != 0:
            reason, remedy = explain_start_failure(proc.stderr + proc.stdout)
            raise EngineError(
                f"Podman cannot start a container here ({self.facts.describe()}): {reason}",
                hint=f"{remedy}. Podman said: {(proc.stderr or proc.stdout).strip().splitlines()[-1][:300]}",
            )

    def choose_builder(self, preference: str) -> Builder:
        if preference in {"buildkit", "legacy"}:
            raise EngineError(
                f"--builder {preference} is Docker's; Podman builds with buildah (`podman build`)",
                hint="use --builder buildah (or auto) with --engine podman",
            )
        return PodmanBuilder(self)

    # --- images -------------------------------------------------------------------------------------------

    def image_exists(self, ref: str) -> bool:
        return self._run("image", "exists", qualify(ref), check=False).returncode == 0

    def _inspect(self, ref: str) -> PodmanImage:
        proc = self._run("image", "inspect", "--format", "json", qualify(ref), check=False)
        if proc.returncode != 0:
            raise EngineError(f"image {ref!r} is not in the engine (podman: {qualify(ref)})")
        found: list[PodmanImage] = json.loads(proc.stdout)
        return found[0]

    def image_info(self, ref: str) -> ImageInfo:
        attrs = self._inspect(ref)
        image_id = str(attrs.get("Id", ""))
        return ImageInfo(
            id=image_id if image_id.startswith("sha256:") else f"sha256:{image_id}",
            tags=tuple(attrs.get("RepoTags") or ()),
            digests=tuple(attrs.get("RepoDigests") or ()),
            size=int(attrs.get("Size", 0)),
            labels=dict((attrs.get("Config") or _ImageConfig()).get("Labels") or attrs.get("Labels") or {}),
            created=str(attrs.get("Created", "")),
        )

    def pull(self, ref: str, *, platform: str | None = None) -> str:
        args = ["pull", "--quiet", *self._tls_args(ref)]
        if platform:
            args += ["--platform", platform]
        proc = self._run(*args, qualify(ref), timeout=1800, check=False)
        if proc.returncode != 0:
            raise EngineError(f"could not pull {qualify(ref)}: {proc.stderr.strip()}")
        return self.image_info(ref).id

    def push(self, ref: str) -> str:
        with tempfile.TemporaryDirectory(prefix="forge-push-") as tmp:
            digest_file = Path(tmp) / "digest"
            args = ["push", "--quiet", *self._tls_args(ref), "--digestfile", str(digest_file)]
            proc = self._run(*args, qualify(ref), ref, timeout=3600, check=False)
            if proc.returncode != 0:
                raise EngineError(f"the engine could not push {ref}: {proc.stderr.strip()[-2000:]}")
            digest = digest_file.read_text().strip() if digest_file.exists() else ""
        if not digest.startswith("sha256:"):
            raise EngineError(f"the engine pushed {ref} but reported no manifest digest")
        return digest

    @staticmethod
    def _tls_args(ref: str) -> list[str]:
        # Plain HTTP only for a registry on this machine's loopback, as Forge's own registry client allows.
        from builders.registry.reference import Reference

        first, sep, _ = ref.partition("/")
        loopback = bool(sep) and Reference(host=first, name="-").loopback
        return ["--tls-verify=false"] if loopback else []

    def image_platform(self, ref: str) -> str:
        attrs = self._inspect(ref)
        return f"{attrs.get('Os', 'linux')}/{attrs.get('Architecture', '?')}"

    @property
    def native_platform(self) -> str:
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), "amd64")
        return f"linux/{arch}"

    def tag(self, image_id: str, ref: str) -> None:
        self._run("tag", qualify(image_id), qualify(ref))

    def untag(self, ref: str) -> None:
        self._run("untag", qualify(ref), qualify(ref), check=False)

    def remove_image(self, ref: str) -> None:
        self._run("rmi", "--force", qualify(ref), check=False)

    def prune_build_cache(self) -> None:
        # buildah keeps its intermediate layers as dangling images: pruning them is Podman's build cache.
        self._run("image", "prune", "-f", check=False)

    def load(self, tarball: bytes | Any) -> list[str]:
        with tempfile.NamedTemporaryFile(prefix="forge-load-", suffix=".tar") as fh:
            # Copied in chunks: an image of several GB (the cpu-wheel's is 3.8) must not be held in memory whole.
            if isinstance(tarball, bytes):
                fh.write(tarball)
            else:
                shutil.copyfileobj(tarball, fh, 1 << 20)
            fh.flush()
            out = self._run("load", "--input", fh.name).stdout
        refs = [
            r.strip() for line in out.splitlines() if "Loaded image" in line for r in line.split(":", 1)[1].split(",")
        ]
        ids = []
        for ref in refs:
            # A docker-archive's Forge names arrive as docker.io/forge/... from some writers: one name for all.
            if ref.startswith("docker.io/forge/"):
                self.tag(ref, ref.removeprefix("docker.io/"))
                self.untag(ref)
            ids.append(
                self.image_info(ref.removeprefix("docker.io/") if ref.startswith("docker.io/forge/") else ref).id
            )
        return ids

    def import_rootfs(
        self, tar_path: str, ref: str, *, changes: list[str] | None = None, platform: str | None = None
    ) -> str:
        args = ["import"]
        if platform:
            # Unlike Docker 20.10's import, Podman's records the architecture it is told.
            os_name, _, arch = platform.partition("/")
            args += ["--os", os_name, "--arch", arch]
        for change in changes or []:
            args += ["--change", change]
        return self._run(*args, tar_path, qualify(ref), timeout=1800).stdout.strip()

    def save_stream(self, ref: str) -> IO[bytes]:
        if not self.image_exists(ref):
            raise EngineError(f"cannot export image {ref!r}: not in the engine", hint="`podman images`")
        proc = subprocess.Popen(
            [self.cli, "save", "--format", "docker-archive", "--output", "/dev/stdout", qualify(ref)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        return proc.stdout

    def rootfs_layers(self, ref: str) -> tuple[str, ...]:
        return tuple(str(layer) for layer in (self._inspect(ref).get("RootFS") or _RootFs()).get("Layers") or ())

    # --- containers ---------------------------------------------------------------------------------------

    def _run_args(self, spec: RunSpec) -> list[str]:
        """`podman run`'s arguments for a named spec (the caller names it, to remove it after a failed start)."""
        assert spec.name, "name the container before starting it: a failed start is removed by name"
        args = ["--name", spec.name, "--network", "host" if spec.network_host else "none"]
        args += ["--shm-size", spec.shm_size]
        for key, value in spec.all_labels().items():
            args += ["--label", f"{key}={value}"]
        for key, value in spec.env.items():
            args += ["--env", f"{key}={value}"]
        for host, target in spec.volumes.items():
            path, _, mode = target.partition(":")
            args += ["--volume", f"{host}:{path}:{'rw' if mode == 'rw' else 'ro'}"]
        if spec.entrypoint is not None:
            args += ["--entrypoint", json.dumps(spec.entrypoint)]
        if spec.user:
            args += ["--user", spec.user]
        if spec.gpus:
            # The NVIDIA Container Toolkit's CDI spec (`nvidia-ctk cdi generate`) names every GPU as this device.
            args += ["--device", "nvidia.com/gpu=all"]
        if spec.cpuset_cpus:
            if not self.facts.capabilities.get("cpuset"):
                raise EngineError(
                    f"cannot confine a container to CPUs {spec.cpuset_cpus}: the cpuset controller is not delegated "
                    f"to this user ({self.facts.describe()})",
                    hint="run rootful, or on cgroups v2 delegate cpuset to the user (systemd: Delegate=cpuset)",
                )
            args += ["--cpuset-cpus", spec.cpuset_cpus]
        return [*args, qualify(spec.image), *spec.command]

    def run_detached(self, spec: RunSpec) -> str:
        spec = replace(spec, name=spec.container_name())
        assert spec.name is not None
        proc = self._run("run", "--detach", *self._run_args(spec), check=False)
        if proc.returncode != 0:
            # run is create + start: a refused start leaves a created container. A name in use is someone else's.
            if "already in use" not in proc.stderr:
                self.stop_and_remove(spec.name, timeout=0)
            reason, remedy = explain_start_failure(proc.stderr)
            hint = "generate the NVIDIA CDI spec (`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`)"
            gpus = " with the host GPUs" if spec.gpus else ""
            raise EngineError(
                f"could not start a container from {qualify(spec.image)}{gpus}: {reason}",
                hint=hint if spec.gpus else remedy,
            )
        return proc.stdout.strip().splitlines()[-1]

    def stop_and_remove(self, cid: str, timeout: int = 5) -> None:
        # A `podman rm` can fail while buildah holds the storage lock (a build committing beside a test stage):
        # one such failure, ignored, left a test-stage container behind. Retry, then say so rather than leave it.
        error = ""
        for attempt in range(3):
            proc = self._run("rm", "--force", "--time", str(timeout), cid, timeout=timeout + 60, check=False)
            if proc.returncode == 0 or self._run("container", "exists", cid, check=False).returncode == 1:
                return
            error = proc.stderr.strip() or proc.stdout.strip()
            time.sleep(2 * (attempt + 1))
        raise EngineError(
            f"podman rm --force {cid} failed three times: {error}", hint=f"remove it by hand: podman rm --force {cid}"
        )

    def kill(self, cid: str) -> None:
        self._run("kill", cid, check=False)

    def is_running(self, cid: str) -> bool:
        proc = self._run("container", "inspect", "--format", "{{.State.Running}}", cid, check=False)
        return proc.returncode == 0 and proc.stdout.strip() == "true"

    def logs(self, cid: str, tail: int = 200) -> str:
        proc = self._run("logs", "--tail", str(tail), cid, check=False)
        return proc.stdout + proc.stderr if proc.returncode == 0 else ""

    def run_once(self, spec: RunSpec, *, timeout: float = 300) -> tuple[int, str]:
        spec = spec.throwaway()
        assert spec.name is not None
        try:
            proc = subprocess.run(
                [self.cli, "run", *self._run_args(spec)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"{spec.image} did not finish {spec.command[:3]} within {timeout:.0f}s") from exc
        finally:
            self.stop_and_remove(spec.name, timeout=1)
        return proc.returncode, proc.stdout

    def containers_with_label(self, key: str, value: str | None = None) -> list[str]:
        selector = f"{key}={value}" if value is not None else key
        out = self._run("ps", "--all", "--no-trunc", "--filter", f"label={selector}", "--format", "{{.ID}}").stdout
        return out.split()

    def all_containers(self) -> dict[str, str]:
        out = self._run("ps", "--all", "--no-trunc", "--format", "{{.ID}} {{.State}}").stdout
        return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


class PodmanBuilder:
    """buildah through `podman build`: --layers keeps each step's image as a cache, secrets and cache mounts when
    the buildah found has them, and --timestamp from SOURCE_DATE_EPOCH so two builds of one input match."""

    name = "buildah"
    layer_cache: LayerCache = "registry"

    def __init__(self, engine: PodmanEngine) -> None:
        self.engine = engine
        self.cli = engine.cli
        self.supports_secrets = engine.facts.capabilities.get("secrets", False)
        self.supports_cache_mounts = engine.facts.capabilities.get("cache_mounts", False)
        self.version = engine.facts.builder_version

    def _working_containers(self) -> set[str]:
        """buildah's working containers (one per build stage in progress): Podman lists them as external."""
        out = self.engine._run("ps", "--all", "--external", "--format", "{{.ID}} {{.Names}}", check=False).stdout
        return {line.split()[0] for line in out.splitlines() if _WORKING_CONTAINER.search(line)}

    def _remove_working_containers(self, before: set[str]) -> None:
        # `podman build` removes its working containers when a step fails (--force-rm), but not when it is
        # itself stopped mid-step (Ctrl-C, SIGTERM): those of this build are the ones that were not there before.
        # A build of another process that started meanwhile would lose its own: Forge runs one build at a time.
        left = sorted(self._working_containers() - before)
        if left:
            self.engine._run("rm", "--force", *left, check=False)

    def build(self, request: BuildRequest, sink: LineSink) -> BuildResult:
        with tempfile.TemporaryDirectory(prefix="forge-iid-") as tmp:
            iidfile = Path(tmp) / "iid"
            # docker format: OCI image configs have no SHELL, and the templates run every RUN under pipefail.
            cmd = [self.cli, "build", "--format", "docker", "--layers", "--force-rm", "--pull=never"]
            cmd += ["--iidfile", str(iidfile)]
            cmd += ["--file", str(request.containerfile)]
            if request.network_host:
                cmd += ["--network", "host"]
            if request.target:
                cmd += ["--target", request.target]
            if request.no_cache:
                cmd.append("--no-cache")
            if request.platform:
                cmd += ["--platform", request.platform]
            # buildah 1.28 takes one repository each way and tags each step's layer by the hash of its inputs.
            cache_repos = [*request.cache_from[:1], *([request.cache_to] if request.cache_to else [])]
            if request.cache_from:
                cmd += ["--cache-from", request.cache_from[0]]
            if request.cache_to:
                cmd += ["--cache-to", request.cache_to]
            if any(self.engine._tls_args(repo) for repo in cache_repos):
                cmd += ["--tls-verify=false"]
            epoch = request.build_args.get("SOURCE_DATE_EPOCH")
            if epoch:
                # Every file's mtime and the image's created time become the epoch: verify-repro compares them.
                cmd += ["--timestamp", epoch]
            cmd += request.cli_flags()
            start = time.monotonic()
            before = self._working_containers()
            rc = -1
            try:
                rc = stream_build(cmd, dict(os.environ), request.log_path, sink)
            finally:
                if rc != 0:
                    self._remove_working_containers(before)
            return BuildResult.from_run(
                builder=self.name,
                returncode=rc,
                iidfile=iidfile,
                seconds=time.monotonic() - start,
                log_path=request.log_path,
            )
