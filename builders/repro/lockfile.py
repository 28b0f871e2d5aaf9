"""forge.lock: everything a build of each distro × target consumes, pinned by content hash.

The file is JSON with sorted keys and entries sorted by name, so two locks of the same inputs are the same
bytes and a change reads as a small diff. `drift()` compares a lock entry with what a build would consume
now and names each entry that moved, with the locked and the current value.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builders.config.loading import validation_error_to_config_error
from builders.errors import ConfigError
from builders.records import Record, absent

LOCK_NAME = "forge.lock"
LOCK_VERSION = 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BaseLock(Strict):
    ref: str = Field(description="tag the build starts FROM (the distro's base.local_tag)")
    declared: str = Field(description="the distro file's base reference, with its digest when pinned")
    how: Literal["local", "registry"] = Field(
        description="local: bootstrapped or loaded here, pinned by its layers; registry: pinned by digest"
    )
    rootfs: tuple[str, ...] = Field(description="the base's layer diff_ids: its content, whoever made it")
    registry_digest: str | None = Field(default=None, description="registry digest, for registry bases")
    image_id: str = Field(description="engine image id when locked; informational: a re-import changes it")


class ArchiveLock(Strict):
    name: str = Field(description="source name (vllm)")
    file: str = Field(description="archive file name")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the archive")


class TreeLock(Strict):
    name: str = Field(description="source name (onednn), as in the recipe's fetched_sources")
    tree_sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="hash over sorted paths, kinds, exec bits and file hashes of the tree"
    )
    files: int = Field(ge=0, description="number of paths hashed")
    version: str | None = Field(default=None, description="upstream version, where the origin names one")
    origin: str = Field(description="where the tree came from (debian-source: onednn 3.7.2+ds-2)")


class WheelLock(Strict):
    file: str = Field(description="wheel file name")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the wheel")
    installed: bool = Field(description="false for wheels the recipe excludes: present in the wheelhouse only")


class RequirementsLock(Strict):
    name: str = Field(description="which install: build, runtime, torch or app")
    origin: str = Field(description="where the lines come from and how they were filtered")
    hashed: bool = Field(description="each line carries --hash (resolved offline); false: ranges pip resolves")
    lines: tuple[str, ...] = Field(description="requirement lines, comments and blank lines dropped")


class PairLock(Strict):
    distro: str = Field(description="distro name")
    target: str = Field(description="target name")
    recipe: str = Field(description="recipe name")
    source_date_epoch: int = Field(ge=0, description="SOURCE_DATE_EPOCH every build of this pair gets")
    epoch_from: str = Field(description="where the epoch was read: the source's release date, or Forge's default")
    base: BaseLock = Field(description="the base image")
    archives: tuple[ArchiveLock, ...] = Field(default=(), description="source archives (the vLLM sdist)")
    trees: tuple[TreeLock, ...] = Field(default=(), description="source trees CMake would otherwise fetch")
    wheels: tuple[WheelLock, ...] = Field(default=(), description="every wheel of the wheelhouse, for wheel targets")
    requirements: tuple[RequirementsLock, ...] = Field(default=(), description="Python requirements per install")

    @property
    def key(self) -> str:
        return pair_key(self.distro, self.target)


class LockFile(Strict):
    version: Literal[1] = Field(default=1, description="lock format version")
    generated_by: str = Field(default="forge lock", description="command that writes this file")
    pairs: dict[str, PairLock] = Field(default_factory=dict, description="one entry per distro/target")


def pair_key(distro: str, target: str) -> str:
    return f"{distro}/{target}"


def dumps(lock: LockFile) -> str:
    """Canonical text: sorted keys, two-space indent, trailing newline; no time, host or user in it."""
    return json.dumps(lock.model_dump(mode="json"), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def read_lock(path: Path) -> LockFile:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no lock file", hint="run `forge lock DISTRO TARGET` and commit forge.lock"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON at line {exc.lineno}: {exc.msg}",
            hint="regenerate it with `forge lock`; never edit it by hand",
        ) from None
    try:
        return LockFile.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_config_error(exc, LockFile, str(path)) from None


def write_lock(path: Path, lock: LockFile) -> None:
    path.write_text(dumps(lock), encoding="utf-8")


def merge(lock: LockFile, entries: list[PairLock]) -> LockFile:
    """The lock with these pairs replaced or added; other pairs are kept as they were."""
    pairs = dict(lock.pairs)
    for entry in entries:
        pairs[entry.key] = entry
    return LockFile(pairs=dict(sorted(pairs.items())))


@dataclass(frozen=True, kw_only=True)
class Drift:
    pair: str
    entry: str
    locked: str
    current: str

    def __str__(self) -> str:
        return f"{self.pair}: {self.entry}: locked {self.locked}, now {self.current}"


def _requirement_key(line: str) -> str:
    """A requirement line's identity: project and marker; the rest is its value."""
    text = line.split(" --hash", 1)[0].strip()
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return text
    name = re.sub(r"[-_.]+", "-", req.name).lower()
    return f"{name}; {req.marker}" if req.marker else name


def flatten(entry: PairLock) -> dict[str, str]:
    """The entries a build's inputs are compared on, keyed by a stable name each."""
    out = {
        "base.ref": entry.base.ref,
        "base.declared": entry.base.declared,
        "base.rootfs": " ".join(entry.base.rootfs) or "(none)",
    }
    if entry.base.registry_digest:
        out["base.registry_digest"] = entry.base.registry_digest
    for archive in entry.archives:
        out[f"archives[{archive.name}]"] = f"{archive.file} sha256:{archive.sha256}"
    for tree in entry.trees:
        out[f"trees[{tree.name}]"] = f"tree sha256:{tree.tree_sha256} ({tree.files} paths, {tree.origin})"
    for wheel in entry.wheels:
        out[f"wheels[{wheel.file}]"] = f"sha256:{wheel.sha256}" + ("" if wheel.installed else " (excluded)")
    for reqs in entry.requirements:
        counts: dict[str, int] = {}
        for line in reqs.lines:
            key = _requirement_key(line)
            counts[key] = counts.get(key, 0) + 1
            suffix = f" #{counts[key]}" if counts[key] > 1 else ""
            out[f"requirements.{reqs.name}[{key}{suffix}]"] = line
    return out


def drift(locked: PairLock, current: PairLock) -> list[Drift]:
    """Every compared entry whose locked and current values differ; the epoch is the lock's to decide."""
    a, b = flatten(locked), flatten(current)
    return [
        Drift(pair=locked.key, entry=key, locked=a.get(key, "(absent)"), current=b.get(key, "(absent)"))
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]


def notes(locked: PairLock, current: PairLock) -> list[str]:
    """Changes that are not drift but worth a line: a base re-imported with the same content."""
    if locked.base.image_id != current.base.image_id and locked.base.rootfs == current.base.rootfs:
        return [
            f"{locked.key}: base {locked.base.ref} has a new image id ({current.base.image_id[:19]}) "
            "with the locked layers: re-imported, same content"
        ]
    return []


# --- what a build report records of the lock (builders/report.py) ----------------------------------------


class DriftRecord(Record):
    pair: str = Field(description="DISTRO/TARGET")
    entry: str = Field(description="the lock entry that moved")
    locked: str = Field(description="its locked value")
    current: str = Field(description="its value now")


class PushedAt(Record):
    pull: str = Field(description="REPOSITORY@DIGEST")
    digest: str = Field(description="the registry's digest")


class LockRecord(Record):
    """The forge.lock entry this build used, and any drift from it."""

    file: str = Field(description="the lock file")
    pair: str = Field(description="DISTRO/TARGET")
    in_lock: bool = Field(description="the lock has an entry for the pair")
    matches: bool = Field(description="the build's inputs are the locked ones")
    drift: list[DriftRecord] = Field(description="each input that moved")
    notes: list[str] = Field(description="what else the lock says of the inputs")
    entries: PairLock = Field(description="the entry (the lock's, or the inputs resolved now when not in it)")
    pushed: PushedAt | None = absent("where `forge push` published the image built from it")


class LockUnresolved(Record):
    file: str = Field(description="the lock file")
    error: str = Field(description="why the inputs could not be resolved (the build went on without a lock)")
    pushed: PushedAt | None = absent("where `forge push` published the image built without it")
