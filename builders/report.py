"""Every build leaves a report: what was built from what, how long each phase took, what was found.

`report.json` is a `BuildReport` (pydantic, `extra="forbid"`, each field described) and `BuildReport.read(path)`
validates one, naming the file and the field that is wrong. A section the build never reached is `{}` (a dict
section) or null, as it always was.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import BeforeValidator, Field, SerializerFunctionWrapHandler, WrapSerializer, model_validator

from builders import interrupt
from builders.diagnose.diagnosis import Diagnosis
from builders.engines.checks import CheckStatus
from builders.errors import ForgeError, PreflightBlocked
from builders.gates.findings import PreflightReport
from builders.rebuild.records import CcacheRecord, ReuseRecord
from builders.records import Record, absent
from builders.repro.lockfile import LockRecord, LockUnresolved
from builders.repro.sbom import SbomFailed, SbomRecord

T = TypeVar("T")


def _empty_is_none(value: object) -> object:
    return None if value == {} else value


def _none_is_empty(value: object, handler: SerializerFunctionWrapHandler) -> object:
    return {} if value is None else handler(value)


# A section the build has not reached yet: None here, `{}` in report.json (what the report always wrote).
OrEmpty = Annotated[T | None, BeforeValidator(_empty_is_none), WrapSerializer(_none_is_empty)]


class EngineRecord(Record):
    """The container engine, as builders/container read it once when it connected."""

    kind: str = Field(description="docker or podman")
    version: str = Field(description="the engine's version")
    rootless: bool = Field(description="the engine runs without root")
    root_dir: str | None = Field(description="where it keeps layers (preflight's disk gate reads it)")
    scratch_dirs: list[str] = Field(description="where its builder stages")
    runtime: str | None = Field(description="the OCI runtime (runc, crun)")
    cgroups: str | None = Field(description="the cgroup version and driver")
    builder_version: str | None = Field(description="Podman: the buildah its `podman build` is")
    capabilities: dict[str, bool] = Field(description="features checked once (secrets, cache mounts, platforms)")


class BuilderRecord(Record):
    name: str = Field(description="the image builder: buildkit-cli, legacy-sdk, podman-build")
    secrets: bool = Field(description="it passes the CA bundle as a build secret")
    cache_mounts: bool = Field(description="it supports RUN --mount=type=cache")
    # Absent from reports written before the registry layer cache (issue 52), which are still read back.
    layer_cache: str | None = absent("how it shares layers through a registry: registry, inline or none")
    cli: str | None = Field(description="the CLI it drives, or null for the engine's API")
    version: str | None = Field(description="its version, where it says")


class SourceRecord(Record):
    """The source the image was built from: an sdist or tree, or a wheelhouse."""

    origin: str = Field(description="where it came from: the cache, an override, a wheelhouse folder")
    sha256: str | None = absent("an archive's or tree's hash")
    path: str | None = absent("where it was read")
    requirements_hash: str | None = absent("a source tree: the hash of its requirements (the environment layer)")
    package_hash: str | None = absent("a source tree: the hash of its package files")
    wheels: list[str] | None = absent("a wheelhouse: its wheels' file names")


class FetchedSourceRecord(Record):
    name: str = Field(description="the recipe's name for it (onednn)")
    origin: str = Field(description="where it came from")
    path: str = Field(description="where it was read")
    cmake_var: str | None = Field(description="the CMake variable that points the build at it")


class BaseImageRecord(Record):
    ref: str = Field(description="the image")
    image_id: str = Field(description="its id in the engine")
    how: str = Field(description="how it was had: bootstrapped, loaded, pulled, present")


class BaseRecord(BaseImageRecord):
    """The image the final stage starts FROM."""

    rootfs_sha256: str | None = Field(description="the hash of its layers, for a bootstrapped base")
    declared: str | None = Field(description="the distro file's reference (with its digest when pinned)")
    images: dict[str, BaseImageRecord] | None = absent("a CUDA build: each base build argument's image")


class TorchRecord(Record):
    requirement: str = Field(description="the torch requirement installed")
    index: str = Field(description="which index it came from")
    index_url: str | None = Field(description="that index's URL")
    cuda_build_on_cpu: bool = Field(description="a CUDA torch installed on a CPU build")


class ImageRecord(Record):
    id: str = Field(description="the image id")
    tags: list[str] = Field(description="its tags")
    size: int = Field(description="bytes")


class ArchList(Record):
    sass: list[str] = Field(description="the GPU archs with machine code (sm_80)")
    ptx: list[str] = Field(description="the archs with PTX, compiled by the driver for newer GPUs")


class CheckData(Record):
    """What a check read and the report keeps: the key of its kind of check."""

    cuda_archs: dict[str, ArchList] | None = absent("cuda-archs: each CUDA library's archs, read by cuobjdump")
    ops: list[str] | None = absent("kernel-ops: the custom ops a kernel library registered with torch, by name")
    torch: str | None = absent("cuda-libs-load: torch's version in the image")
    cuda_runtime: str | None = absent(
        "cuda-libs-load: the CUDA torch was built for (torch.version.cuda), what the driver gate judges hosts by"
    )


class CheckRecord(Record):
    """One check of the test stage, run in the image just built."""

    name: str = Field(description="the check")
    status: CheckStatus = Field(description="skipped is neither passed nor failed")
    ok: bool = Field(description="false fails the build")
    detail: str = Field(description="what it found, or why it was skipped")
    seconds: float = Field(description="how long it took")
    data: CheckData | None = absent(
        "what it read, kept for later gates (cuda-archs, cuda-libs-load) and readers (kernel-ops)"
    )

    @model_validator(mode="before")
    @classmethod
    def _status_of_older_reports(cls, data: object) -> object:
        # Reports written before `status` was a field said only ok; a skipped check did not exist then.
        if isinstance(data, dict) and "status" not in data and isinstance(data.get("ok"), bool):
            return {**data, "status": "passed" if data["ok"] else "failed"}
        return data

    def status_text(self) -> str:
        """As a line reads it: `ok DETAIL`, `FAILED DETAIL` or `skipped: REASON` (never `ok`)."""
        detail = self.detail.strip().splitlines()
        first = detail[0] if detail else ""
        if self.status == "skipped":
            return first if first.startswith("skipped") else f"skipped: {first or 'no reason given'}"
        return f"{'ok' if self.status == 'passed' else 'FAILED'} {first}".rstrip()


class PreflightSkipped(Record):
    verdict: Literal["skipped"] = Field(description="no gate was evaluated")
    complete: Literal[False] = Field(description="never complete")
    why: str = Field(description="--skip-preflight")


class PlatformRecord(Record):
    name: str = Field(description="what it was built for (linux/arm64)")
    host: str = Field(description="the machine it was built on")
    emulated: bool = Field(description="built under qemu-user-static")
    stand_in: str | None = absent("what the checks of an emulated image ran against instead")


class PushedSbom(Record):
    ref: str = Field(description="REPOSITORY:sha256-HEX.sbom")
    digest: str = Field(description="the artifact manifest's digest")
    blob: str = Field(description="the SBOM blob's digest")
    convention: str = Field(description="how it is found from the image (cosign tag)")


class IndexRecord(Record):
    ref: str = Field(description="the name every platform is under")
    digest: str = Field(description="the index's digest")
    media_type: str = Field(description="Docker manifest list or OCI index")
    platforms: list[str] = Field(description="the platforms it names")


class PushRecord(Record):
    """Where `forge push` published the image."""

    platform: str = Field(description="the image's platform")
    ref: str = Field(description="the tag pushed")
    digest: str = Field(description="as the registry serves it (HEAD)")
    media_type: str = Field(description="the manifest's media type")
    size: int = Field(description="the manifest's size")
    sbom: PushedSbom | None = Field(description="the SBOM stored beside the image")
    registry: str = Field(description="the registry host")
    scheme: str = Field(description="http or https")
    verified: str = Field(description="how the digest was verified")
    pull: str = Field(description="REPOSITORY@DIGEST")
    tests: dict[str, str] = Field(description="each check's status, as the build's test stage ended")
    pushed_by: str = Field(description="the engine and machine that pushed")
    index: IndexRecord | None = absent("several platforms: the index joining them")


BuildResult = Literal["running", "succeeded", "failed", "blocked", "interrupted"]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class BuildReport(Record):
    """`forge build`: what was built from what, how long each phase took, what was found."""

    distro: str = Field(description="distro name")
    target: str = Field(description="target name")
    recipe: str = Field(description="recipe name")
    result: BuildResult = Field(default="running", description="how the build ended")
    error: str | None = Field(default=None, description="what stopped it")
    ended_in: str | None = Field(
        default=None, description="the phase that was running when the build failed, was blocked or interrupted"
    )
    signal: str | None = Field(default=None, description="what interrupted it: SIGINT (Ctrl-C), SIGTERM or SIGHUP")
    started: str = Field(default_factory=_now, description="ISO 8601, UTC")
    engine: OrEmpty[EngineRecord] = Field(default=None, description="the container engine")
    builder: OrEmpty[BuilderRecord] = Field(default=None, description="the image builder")
    source: OrEmpty[SourceRecord] = Field(default=None, description="what was built")
    fetched_sources: list[FetchedSourceRecord] = Field(default_factory=list, description="sources fetched beside it")
    base: OrEmpty[BaseRecord] = Field(default=None, description="the base image")
    build_args: dict[str, str] = Field(default_factory=dict, description="the Containerfile's build arguments")
    compile_env: dict[str, str] = Field(default_factory=dict, description="the compile's environment")
    torch: OrEmpty[TorchRecord] = Field(default=None, description="the torch installed")
    ca_bundle: str | None = Field(default=None, description="the CA bundle the build trusted, and where it was found")
    phases: dict[str, float] = Field(default_factory=dict, description="seconds per phase, in running order")
    stage_seconds: dict[str, float] = Field(default_factory=dict, description="seconds per build stage")
    image: OrEmpty[ImageRecord] = Field(default=None, description="the image tagged; `{}` when none was")
    versions: dict[str, str] = Field(default_factory=dict, description="toolchain and package versions found")
    tests: list[CheckRecord] = Field(default_factory=list, description="the test stage's checks")
    preflight: PreflightReport | PreflightSkipped | None = Field(default=None, description="the gates' verdict")
    diagnosis: Diagnosis | None = Field(default=None, description="why a failed build or test stage failed")
    log: str | None = Field(default=None, description="the build log")
    containerfile: str | None = Field(default=None, description="the rendered Containerfile")
    lock: LockRecord | LockUnresolved | None = Field(
        default=None, description="forge.lock entries this build used, and any drift from them"
    )
    sbom: SbomRecord | SbomFailed | None = Field(default=None, description="the image's CycloneDX SBOM")
    platform: OrEmpty[PlatformRecord] = Field(
        default=None, description="built for (linux/arm64), and whether under emulation"
    )
    reuse: ReuseRecord | None = Field(default=None, description="a source-tree build: what each layer reused")
    push: PushRecord | None = Field(default=None, description="where `forge push` published the image")

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(time.monotonic() - start, 2)

    def record_end(self, exc: BaseException, running: str | None) -> None:
        """What stopped the build, during which phase (None: before the first)."""
        self.ended_in = running
        if isinstance(exc, PreflightBlocked):
            self.result, self.error = "blocked", exc.render()
        elif isinstance(exc, KeyboardInterrupt):
            # SIGTERM and SIGHUP arrive as this too (builders/interrupt.py): one path for every way a build stops.
            self.result, self.signal = "interrupted", interrupt.signal_of(exc)
            self.error = f"interrupted by {self.signal} during {running or 'the start'}"
        elif isinstance(exc, ForgeError):
            self.result, self.error = "failed", exc.render()
        else:  # a defect in Forge: the report must not go on saying "running"
            self.result, self.error = "failed", f"{type(exc).__name__}: {exc}"

    def summary(self) -> str:
        lines = [f"forge build {self.distro} {self.target}: {self.result.upper()}"]
        if self.error:
            lines.append(f"  error: {self.error.splitlines()[0]}")
        if self.ended_in:
            lines.append(f"  ended in: {self.ended_in} ({self.phases.get(self.ended_in, 0.0):.1f}s)")
        if self.source:
            lines.append(f"  source: {self.source.origin} sha256={self.source.sha256}")
        if self.base:
            lines.append(f"  base: {self.base.ref} ({self.base.how}) {self.base.image_id[:19]}")
        if self.preflight:
            lines.append(f"  preflight: {preflight_line(self.preflight)}")
        if self.engine:
            mode = "rootless" if self.engine.rootless else "rootful"
            lines.append(f"  engine: {self.engine.kind} {self.engine.version} ({mode})")
        if self.platform and self.platform.name != "linux/amd64":
            emulated = " under emulation (qemu-user-static)" if self.platform.emulated else ""
            lines.append(f"  platform: {self.platform.name}{emulated}")
            if self.platform.stand_in:
                lines.append(f"    {self.platform.stand_in}")
        if self.builder:
            version = f" {self.builder.version}" if self.builder.version else ""
            lines.append(f"  builder: {self.builder.name}{version} ({self.builder.cli or 'engine API'})")
        if self.image:
            size = self.image.size / 1e9
            lines.append(f"  image: {', '.join(self.image.tags)} {self.image.id[:19]} {size:.2f} GB")
        elif self.result != "running":
            lines.append("  image: none (nothing was tagged)")
        if self.versions:
            lines.append("  versions: " + ", ".join(f"{k} {v}" for k, v in self.versions.items()))
        if self.phases:
            lines.append("  phases: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.phases.items()))
        for test in self.tests:
            lines.append(f"  test {test.name}: {test.status_text()}")
        if self.diagnosis:
            lines.append(
                f"  diagnosis: {self.diagnosis.category} at line {self.diagnosis.line_number}: "
                f"{(self.diagnosis.line or '')[:100]}"
            )
            lines.append(f"  remedy: {self.diagnosis.remedy}")
        if self.reuse:
            lines.extend(reuse_lines(self.reuse))
        if isinstance(self.lock, LockRecord):
            if self.lock.matches:
                state = "matches forge.lock"
            elif self.lock.in_lock:
                state = f"{len(self.lock.drift)} input(s) differ from forge.lock"
            else:
                state = "not in forge.lock"
            lines.append(f"  lock: {state}")
        elif self.lock:
            lines.append(f"  lock: {self.lock.error}")
        if self.sbom:
            lines.append(f"  sbom: {self.sbom.path if isinstance(self.sbom, SbomRecord) else self.sbom.error}")
        if self.push:
            lines.append(f"  pushed: {self.push.pull} (registry digest, verified by HEAD)")
            if self.push.sbom:
                lines.append(f"  sbom in registry: {self.push.sbom.ref}")
            if self.push.index:
                index = self.push.index
                lines.append(f"  index: {index.ref} {index.digest} ({', '.join(index.platforms)})")
        if self.log:
            lines.append(f"  log: {self.log}")
        return "\n".join(lines)

    def write(self, folder: Path) -> Path:
        """report.json and summary.txt, each staged beside its final name and renamed in place: a reader, or a
        signal that ends the process, never finds a half-written report."""
        folder.mkdir(parents=True, exist_ok=True)
        staged = []
        for name, text in (("report.json", self.to_json()), ("summary.txt", self.summary())):
            tmp = folder / f".{name}.new"
            tmp.write_text(text + "\n")
            staged.append((tmp, folder / name))
        for tmp, final in staged:
            tmp.replace(final)
        return folder / "report.json"


def preflight_line(preflight: PreflightReport | PreflightSkipped) -> str:
    """The verdict as the summary states it: never clear for a gate that was not evaluated."""
    if isinstance(preflight, PreflightSkipped):
        return f"SKIPPED ({preflight.why})"
    verdict = preflight.verdict
    blocking = [f.gate for f in preflight.findings if f.blocking]
    skipped = list(preflight.not_evaluated)
    parts = [f"blocking: {', '.join(blocking)}"] if blocking else []
    parts += [f"not evaluated: {', '.join(skipped)}"] if skipped else []
    passed = len(preflight.passed)
    return f"{verdict.upper() if verdict != 'clear' else verdict} ({'; '.join([*parts, f'{passed} passed'])})"


def reuse_lines(reuse: ReuseRecord) -> list[str]:
    """A source-tree build's reuse section in the summary: one line per layer, then ccache's counters."""
    if reuse.environment is None or reuse.extension is None or reuse.package is None:
        return cache_lines(reuse)  # a build from an sdist: only the caches' lines
    env, ext, pkg = reuse.environment, reuse.extension, reuse.package
    lines = [
        f"  environment: {env.verdict} (requirements {env.requirements_hash[:12]})",
        f"  extension: {ext.verdict} (compiler inputs {ext.compiler_input_hash[:12]})",
    ]
    for label, changed in (("extension", ext.changed_files), ("package", pkg.changed_files)):
        if changed:
            more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
            lines.append(f"    {label} files changed since the last build: {', '.join(changed[:5])}{more}")
    ccache = reuse.ccache
    if isinstance(ccache, CcacheRecord):
        rate = ccache.hit_rate
        lines.append(
            f"  ccache: {ccache.hits} hits, {ccache.misses} misses, "
            f"{ccache.uncacheable} uncacheable, hit rate {'n/a' if rate is None else f'{rate:.0%}'}"
        )
    elif ccache:
        lines.append(f"  ccache: {ccache}")
    lines += cache_lines(reuse)
    return lines


def cache_lines(reuse: ReuseRecord) -> list[str]:
    """The caches that outlive the runner (builders/cache/): hits and misses per backend, layers imported and
    exported, and every warning a cache gave."""
    lines = []
    compiler = reuse.compiler_cache
    if compiler is not None:
        for name, counters in compiler.backends.items():
            lines.append(
                f"  {compiler.launcher} on {name}: {counters.hits} hits, {counters.misses} misses, "
                f"{counters.errors} errors"
            )
    layer = reuse.layer_cache
    if layer is not None and layer.repository:
        lines.append(
            f"  layer cache {layer.repository}: imported {', '.join(layer.imported) or 'nothing'}; "
            f"exported {', '.join(layer.exported) or 'nothing'}"
        )
    lines += [f"  cache warning: {w}" for w in reuse.cache_warnings or []]
    return lines
