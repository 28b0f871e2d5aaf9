"""`forge push` and `forge build --push`: publish images that passed their test stage, by digest.

The engine pushes each platform's image (it holds the layers); the rest is the registry's HTTP API: the digest
is read back with a HEAD on the manifest (the registry's word, not the engine's), the SBOM is stored beside the
image, and several platforms are joined under one name by a manifest list / OCI index written here.

SBOM convention: the tag `sha256-<hex of the image digest>.sbom` in the image's repository (the sigstore/cosign
convention), holding an OCI artifact manifest (artifactType application/vnd.cyclonedx+json) whose `subject` is
the image. The tag is what a user, or `cosign download sbom`, finds from the digest on any registry; distribution
2.8 (Debian's docker-registry, which CI runs) has no referrers API, so `subject` alone would be unfindable there,
while a registry that has one also lists the artifact as a referrer of the image.

Nothing is written until every push of the set is verified: a failed push leaves each report as it was.
"""

from __future__ import annotations

import json
import platform as host_platform
from dataclasses import dataclass
from pathlib import Path

from builders.container import Engine
from builders.errors import ForgeError
from builders.log import Log
from builders.platforms import BY_ARCH, Platform
from builders.records import ReportInvalid
from builders.registry import Reference, RegistryClient
from builders.registry.client import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST
from builders.report import BuildReport, IndexRecord, PushedSbom, PushRecord
from builders.repro.lockfile import PushedAt
from builders.repro.sbom import SbomRecord

SBOM_MEDIA_TYPE = "application/vnd.cyclonedx+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"


class PushRefused(ForgeError):
    """The image has not earned a push: no report, a failed or skipped test stage, or not the image proven."""

    exit_code = 17
    kind = "push refused"


class PushFailed(ForgeError):
    """The engine or the registry failed the push, or the registry serves another digest than was pushed."""

    exit_code = 18
    kind = "push failed"


@dataclass(frozen=True, kw_only=True)
class Proven:
    """A built image whose report says its test stage passed, and the report that says so."""

    platform: Platform
    report_dir: Path
    report: BuildReport
    image_id: str


@dataclass(frozen=True, kw_only=True)
class Pushed:
    platform: str
    ref: str  # the tag pushed
    digest: str  # as the registry serves it (HEAD), equal to the engine's
    media_type: str
    size: int
    sbom: PushedSbom | None


def sbom_tag(digest: str) -> str:
    """sha256:abc… → sha256-abc….sbom: the tag a digest's SBOM lives under."""
    return digest.replace(":", "-", 1) + ".sbom"


def load_report(report_dir: Path) -> BuildReport:
    """The build report, validated: an edited or foreign report.json proves nothing, and the error names its field."""
    path = report_dir / "report.json"
    if not path.is_file():
        raise PushRefused(
            f"no build report at {path}: nothing says this image passed its test stage",
            hint="build it first (`forge build DISTRO TARGET`), or pass --report-dir where its report is",
        )
    try:
        return BuildReport.read(path)
    except ReportInvalid as exc:
        raise PushRefused(
            f"not a build report Forge wrote: {exc.message}",
            hint="build it again (`forge build DISTRO TARGET`): a report edited by hand proves nothing",
        ) from None


def proven(engine: Engine, report_dir: Path, platform: Platform) -> Proven:
    """The image this report proved, or PushRefused saying why it may not be pushed."""
    report = load_report(report_dir)
    where = report_dir / "report.json"
    pair = f"{report.distro} {report.target} ({platform.name})"
    if report.result != "succeeded":
        raise PushRefused(
            f"{pair}: the build {report.result}; {where} records no proven image",
            hint="fix the build and run it again; only an image whose test stage passed is pushed",
        )
    failed = [t.name for t in report.tests if t.status == "failed"]
    if failed:
        raise PushRefused(f"{pair}: test stage failed ({', '.join(failed)}) in {where}")
    if not report.tests or "test" not in report.phases:
        raise PushRefused(
            f"{pair}: the test stage did not run (built with --skip-tests?); {where} proves nothing",
            hint="build it again without --skip-tests",
        )
    built_for = report.platform.name if report.platform else "linux/amd64"
    if built_for != platform.name:
        raise PushRefused(f"{pair}: {where} is a {built_for} build, not {platform.name}")
    image_id = report.image.id if report.image else ""
    tags = list(report.image.tags) if report.image else []
    local = engine.image_info(tags[0]).id if tags and engine.image_exists(tags[0]) else None
    if not image_id or local != image_id:
        raise PushRefused(
            f"{pair}: the engine's {tags[0] if tags else 'image'} is {local or 'absent'}, not the {image_id or '?'} "
            f"that {where} proved",
            hint="build it again: only the image the test stage ran against is pushed",
        )
    return Proven(platform=platform, report_dir=report_dir, report=report, image_id=image_id)


def push_one(engine: Engine, client: RegistryClient, image: Proven, ref: Reference, log: Log) -> Pushed:
    """Push one platform's image under ref's tag and verify the registry serves the digest the engine pushed."""
    target = str(ref)
    engine.tag(image.image_id, target)
    try:
        with log.step(f"push {image.platform.name} {target}"):
            try:
                engine_digest = engine.push(target)
            except ForgeError as exc:
                raise PushFailed(exc.message, hint=exc.hint or f"is the registry {ref.host} up and writable?") from exc
    finally:
        engine.untag(target)  # the push is by digest from here on; no registry tag stays in the engine
    served = client.head_manifest(ref.name, ref.tag or "latest")
    if served is None or served[0] != engine_digest:
        raise PushFailed(
            f"{target}: the engine pushed {engine_digest}, the registry serves {served[0] if served else 'nothing'}",
            hint="another push to the same tag raced this one; push again, or to a tag of its own",
        )
    digest, media_type, size = served
    log.info(f"pushed {ref.repository}@{digest} (registry HEAD agrees)")
    sbom = push_sbom(client, ref, image, digest, media_type, size, log)
    return Pushed(platform=image.platform.name, ref=target, digest=digest, media_type=media_type, size=size, sbom=sbom)


def push_sbom(
    client: RegistryClient, ref: Reference, image: Proven, digest: str, media_type: str, size: int, log: Log
) -> PushedSbom | None:
    """The report's SBOM as an OCI artifact tagged sha256-<hex>.sbom, its subject the image (module docstring)."""
    sbom = image.report.sbom
    path = Path(sbom.path) if isinstance(sbom, SbomRecord) else None
    if path is None or not path.is_file():
        log.warning(f"no SBOM beside {image.report_dir / 'report.json'}: {ref.repository}@{digest} has none")
        return None
    data = path.read_bytes()
    blob = client.put_blob(ref.name, data)
    config = client.put_blob(ref.name, EMPTY)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": SBOM_MEDIA_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": config, "size": len(EMPTY)},
        "layers": [
            {
                "mediaType": SBOM_MEDIA_TYPE,
                "digest": blob,
                "size": len(data),
                "annotations": {"org.opencontainers.image.title": path.name},
            }
        ],
        "subject": {"mediaType": media_type, "digest": digest, "size": size},
        "annotations": {"dev.forge.sbom.format": "CycloneDX", "dev.forge.platform": image.platform.name},
    }
    tag = sbom_tag(digest)
    artifact = client.put_manifest(ref.name, tag, json.dumps(manifest, sort_keys=True).encode(), OCI_MANIFEST)
    log.info(f"sbom {ref.repository}:{tag} ({artifact})")
    return PushedSbom(ref=f"{ref.repository}:{tag}", digest=artifact, blob=blob, convention="cosign tag")


def write_index(client: RegistryClient, ref: Reference, pushed: list[Pushed]) -> IndexRecord:
    """One name for every platform: a Docker manifest list over Docker manifests (what Docker pushes), an OCI
    index over OCI ones, so the list never mixes the two families."""
    media_type = DOCKER_LIST if all(p.media_type == DOCKER_MANIFEST for p in pushed) else OCI_INDEX
    manifests = []
    for p in pushed:
        plat = next(x for x in BY_ARCH.values() if x.name == p.platform)
        manifests.append(
            {
                "mediaType": p.media_type,
                "digest": p.digest,
                "size": p.size,
                "platform": {"architecture": plat.oci_arch, "os": "linux"},
            }
        )
    body = json.dumps({"schemaVersion": 2, "mediaType": media_type, "manifests": manifests}, indent=2).encode()
    tag = ref.tag or "latest"
    digest = client.put_manifest(ref.name, tag, body, media_type)
    served = client.head_manifest(ref.name, tag)
    if served is None or served[0] != digest:
        raise PushFailed(f"{ref}: the index Forge wrote is {digest}, the registry serves {served}")
    return IndexRecord(ref=str(ref), digest=digest, media_type=media_type, platforms=[p.platform for p in pushed])


def index_of_digests(ref: Reference, digests: dict[str, str], log: Log) -> IndexRecord:
    """The index over images already pushed by digest (one per platform, by jobs on other machines): each is
    read back from the registry first, so the index names only manifests the registry holds."""
    client = RegistryClient(ref)
    pushed = []
    for platform_name, digest in digests.items():
        served = client.head_manifest(ref.name, digest)
        if served is None:
            raise PushFailed(
                f"{ref.repository}@{digest} ({platform_name}) is not in the registry",
                hint="push each platform's image first (`forge push … --platform`), then write the index",
            )
        pushed.append(
            Pushed(
                platform=platform_name,
                ref=f"{ref.repository}@{digest}",
                digest=digest,
                media_type=served[1],
                size=served[2],
                sbom=None,
            )
        )
    index = write_index(client, ref, pushed)
    log.info(f"index {ref} = {index.digest} names {', '.join(index.platforms)}")
    return index


def publish(engine: Engine, images: list[Proven], ref: Reference, log: Log) -> list[BuildReport]:
    """Push every image, one platform each; several are pushed as TAG-ARCH and joined under TAG by an index.
    Every report gets its push record only when the whole set succeeded."""
    if ref.digest:
        raise PushRefused(f"{ref}: a push names a tag, not a digest", hint="drop the @sha256:… part")
    client = RegistryClient(ref)
    tag = ref.tag or "latest"
    many = len(images) > 1
    pushed = [
        push_one(engine, client, image, ref.with_tag(f"{tag}-{image.platform.oci_arch}" if many else tag), log)
        for image in images
    ]
    index = write_index(client, ref.with_tag(tag), pushed) if many else None
    if index:
        log.info(f"index {ref.repository}@{index.digest} names {', '.join(index.platforms)}")
    reports = []
    for image, done in zip(images, pushed, strict=True):
        report = image.report
        record = PushRecord(
            platform=done.platform,
            ref=done.ref,
            digest=done.digest,
            media_type=done.media_type,
            size=done.size,
            sbom=done.sbom,
            registry=ref.host,
            scheme=ref.scheme,
            verified="registry HEAD /v2/<name>/manifests/<tag>: Docker-Content-Digest equals the engine's",
            pull=f"{ref.repository}@{done.digest}",
            tests={t.name: t.status for t in report.tests},
            pushed_by=f"{engine.kind} {engine.version} on {host_platform.machine()}",
            index=index,
        )
        report.push = record
        if report.lock is not None:
            # The lock entry this image was built from, and the digest it became where it was published.
            report.lock.pushed = PushedAt(pull=record.pull, digest=done.digest)
        reports.append(report)
    for image, report in zip(images, reports, strict=True):
        report.write(image.report_dir)
    return reports
