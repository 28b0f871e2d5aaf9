"""An image's layers as file trees, read from the engine's export (`docker save`) in one streaming pass.

Nothing is unpacked to disk: each layer's tar is read in order and every regular file is hashed as it
goes by, so a 10 GB image costs time, not space.

The export is the engine's (`Engine.save_stream`: Docker's `docker save`, Podman's docker-archive); both put
manifest.json, the config and one tar per layer in it, named differently (`<id>/layer.tar`, `<digest>.tar`).
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TypedDict

from builders.container import Engine
from builders.errors import EngineError

WHITEOUT = ".wh."


@dataclass(frozen=True, slots=True)
class Entry:
    """One path of a layer: what a reader of the image sees, and the mtime kept apart from it."""

    kind: str  # file, dir, symlink, hardlink, whiteout, other
    mode: int
    uid: int
    gid: int
    size: int
    digest: str  # sha256 of a file's bytes; a link's target; "" for the rest
    # The same, with a timestamp-checked .pyc's copy of its source's mtime blanked: that field and the
    # file's own mtime are one fact (when the source was written), so both count as mtime differences.
    digest_sans_mtime: str
    mtime: int


@dataclass(frozen=True, kw_only=True)
class Layer:
    diff_id: str
    member: str  # the layer's tar inside the export, to find it again for a second read
    created_by: str
    entries: dict[str, Entry] = field(default_factory=dict)


class History(TypedDict, total=False):
    created: str
    created_by: str
    author: str
    comment: str
    empty_layer: bool


class RootFs(TypedDict, total=False):
    type: str
    diff_ids: list[str]


class ImageConfig(TypedDict, total=False):
    """An image's config JSON (the OCI image spec's, which Docker's export also writes): the engine's, not Forge's.
    The keys named here are what Forge reads; verify-repro compares every key, these and any other."""

    architecture: str
    os: str
    variant: str
    author: str
    created: str
    config: dict[str, object]
    container: str
    container_config: dict[str, object]
    docker_version: str
    rootfs: RootFs
    history: list[History]


@dataclass(frozen=True, kw_only=True)
class ExportedImage:
    ref: str
    image_id: str
    config: ImageConfig
    layers: tuple[Layer, ...]


def image_rootfs(engine: Engine, ref: str) -> tuple[str, ...]:
    """The image's layer diff_ids: the engine's content hashes of each uncompressed layer."""
    return engine.rootfs_layers(ref)


def _pyc_sans_mtime(data: bytes) -> bytes:
    """A .pyc with its timestamp field zeroed when it is timestamp-checked (PEP 552 flags == 0)."""
    if len(data) >= 16 and data[4:8] == b"\0\0\0\0":
        return data[:8] + b"\0\0\0\0" + data[12:]
    return data


def _kind(member: tarfile.TarInfo) -> str:
    if PurePosixPath(member.name).name.startswith(WHITEOUT):
        return "whiteout"
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    return "other"


def _norm(name: str) -> str:
    name = name.removeprefix("./").strip("/")
    return "/" if name in {"", "."} else "/" + name


def read_layer(fileobj: IO[bytes]) -> dict[str, Entry]:
    """Every path of one layer tar, with content hashes; hard links take their target's hash."""
    entries: dict[str, Entry] = {}
    with tarfile.open(fileobj=fileobj, mode="r|") as layer:
        for member in layer:
            kind = _kind(member)
            path = _norm(member.name)
            digest = sans = ""
            if kind == "file":
                handle = layer.extractfile(member)
                data = handle.read() if handle else b""
                digest = hashlib.sha256(data).hexdigest()
                sans = hashlib.sha256(_pyc_sans_mtime(data)).hexdigest() if path.endswith(".pyc") else digest
            elif kind == "symlink":
                digest = sans = member.linkname
            elif kind == "hardlink":
                target = entries.get(_norm(member.linkname))
                digest = target.digest if target else f"link:{member.linkname}"
                sans = target.digest_sans_mtime if target else digest
            entries[path] = Entry(
                kind=kind,
                mode=member.mode,
                uid=member.uid,
                gid=member.gid,
                size=member.size,
                digest=digest,
                digest_sans_mtime=sans,
                mtime=int(member.mtime),
            )
    return entries


def export_image(engine: Engine, ref: str) -> ExportedImage:
    """Read an image's config and every layer's file tree from the engine's export."""
    image_id = engine.image_info(ref).id
    by_member: dict[str, dict[str, Entry]] = {}
    blobs: dict[str, bytes] = {}
    with tarfile.open(fileobj=engine.save_stream(ref), mode="r|") as outer:
        for member in outer:
            if not member.isreg():
                continue
            handle = outer.extractfile(member)
            if handle is None:
                continue
            if member.name.endswith(".tar"):
                by_member[member.name] = read_layer(handle)
            elif member.name.endswith(".json"):
                blobs[member.name] = handle.read()
    manifest = json.loads(blobs.get("manifest.json", b"[]"))
    if not manifest:
        raise EngineError(f"the engine's export of {ref} has no manifest.json", hint="is the engine Docker-compatible?")
    config: ImageConfig = json.loads(blobs[manifest[0]["Config"]])
    diff_ids = config.get("rootfs", {}).get("diff_ids", [])
    history = [h for h in config.get("history", []) if not h.get("empty_layer")]
    layers = []
    for index, name in enumerate(manifest[0]["Layers"]):
        created_by = str(history[index].get("created_by", "")) if index < len(history) else ""
        layers.append(
            Layer(
                diff_id=diff_ids[index] if index < len(diff_ids) else "",
                member=name,
                created_by=created_by,
                entries=by_member.get(name, {}),
            )
        )
    return ExportedImage(ref=ref, image_id=image_id, config=config, layers=tuple(layers))


def extract_paths(engine: Engine, ref: str, wanted: dict[str, set[str]], dest: Path) -> dict[tuple[str, str], Path]:
    """Copy chosen files of chosen layers out of the export: {(layer member, path): file written}."""
    written: dict[tuple[str, str], Path] = {}
    with tarfile.open(fileobj=engine.save_stream(ref), mode="r|") as outer:
        for member in outer:
            if member.name not in wanted or not member.isreg():
                continue
            handle = outer.extractfile(member)
            if handle is None:
                continue
            paths = wanted[member.name]
            with tarfile.open(fileobj=handle, mode="r|") as layer:
                for inner in layer:
                    path = _norm(inner.name)
                    if path not in paths or not inner.isreg():
                        continue
                    data = layer.extractfile(inner)
                    out = dest / f"{len(written):04d}-{PurePosixPath(path).name}"
                    out.write_bytes(data.read() if data else b"")
                    written[(member.name, path)] = out
    return written
