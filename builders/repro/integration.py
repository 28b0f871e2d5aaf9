"""The two phases the executor (builders/build.py) runs from this package: lock and sbom.

Kept here so the executor stays a list of phases: it calls `lock_phase` once sources and base are known
(before the plan, which needs the epoch), and `sbom_phase` once the image is tagged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

from builders.config.models import Distro, Recipe, TorchIndex
from builders.container import Engine
from builders.errors import ForgeError
from builders.platforms import platform_of
from builders.project import Project
from builders.repro.errors import LockDrift
from builders.repro.lockfile import (
    LOCK_NAME,
    DriftRecord,
    LockRecord,
    LockUnresolved,
    PairLock,
    drift,
    notes,
    pair_key,
    read_lock,
)
from builders.repro.resolve import resolve_pair
from builders.repro.sbom import SBOM_LABEL, SbomFailed, SbomRecord, sbom_label, write_sbom

Sink = Callable[[str], None]


class _Image(Protocol):
    @property
    def id(self) -> str: ...


class Recorded(Protocol):
    """The parts of the build report (builders/report.py) these phases fill in and read; the report imports this
    package's records, so this package names the report only by what it has."""

    lock: LockRecord | LockUnresolved | None
    sbom: SbomRecord | SbomFailed | None

    @property
    def distro(self) -> str: ...

    @property
    def target(self) -> str: ...

    @property
    def image(self) -> _Image | None: ...


class LockOptions(Protocol):
    """What the lock phase reads from BuildOptions."""

    @property
    def locked(self) -> bool: ...
    @property
    def lock_file(self) -> Path | None: ...
    @property
    def source_date_epoch(self) -> int | None: ...
    @property
    def source_overrides(self) -> dict[str, Path]: ...
    @property
    def torch_version(self) -> str | None: ...
    @property
    def torch_index(self) -> TorchIndex | None: ...


def locked_entry(
    project: Project, distro: Distro, recipe: Recipe, lock_file: Path | None, *, required: bool
) -> tuple[Path, PairLock | None]:
    path = lock_file or project.root / LOCK_NAME
    key = pair_key(distro.name, recipe.target)
    plat = platform_of(distro)
    if not plat.native:
        # forge.lock pins each pair's linux/amd64 inputs; an arm64 base and wheelhouse are other bytes, and
        # comparing them with the amd64 entry would report every input as drift.
        if required:
            raise LockDrift(
                f"--locked, but {path.name} pins linux/amd64 inputs only, not {plat.name}",
                hint=f"build {plat.name} without --locked",
            )
        return path, None
    if not path.exists():
        if required:
            raise LockDrift(
                f"--locked, but there is no {path}",
                hint=f"run `forge lock {distro.name} {recipe.target}` and commit {LOCK_NAME}",
            )
        return path, None
    entry = read_lock(path).pairs.get(key)
    if entry is None and required:
        raise LockDrift(
            f"--locked, but {path.name} has no entry for {key}",
            hint=f"run `forge lock {distro.name} {recipe.target}` and commit {LOCK_NAME}",
        )
    return path, entry


def check_drift(locked: PairLock, current: PairLock, lock_path: Path) -> None:
    """Raise LockDrift naming every moved entry, with its locked and current value."""
    moved = drift(locked, current)
    if moved:
        raise LockDrift(
            f"{locked.key}: {len(moved)} input(s) differ from {lock_path.name}:\n  - "
            + "\n  - ".join(str(d) for d in moved),
            hint=f"if the change is meant, run `forge lock {locked.distro} {locked.target}` and commit "
            f"{LOCK_NAME}; otherwise restore the locked input",
        )


def lock_phase(
    project: Project,
    distro: Distro,
    recipe: Recipe,
    engine: Engine,
    report: Recorded,
    options: LockOptions,
    wheelhouse: Path | None,
    sink: Sink,
) -> int | None:
    """Record the lock entries this build uses, refuse drift under --locked; return the epoch to build with."""
    lock_path, entry = locked_entry(project, distro, recipe, options.lock_file, required=options.locked)
    try:
        current = resolve_pair(
            project,
            distro,
            recipe,
            engine,
            source_overrides=options.source_overrides,
            wheelhouse=wheelhouse,
            torch_version=options.torch_version,
            torch_index=options.torch_index,
        )
    except ForgeError as exc:
        if options.locked:
            raise
        report.lock = LockUnresolved(file=str(lock_path), error=exc.message)
        sink(f"forge: lock: inputs not resolved ({exc.message.splitlines()[0]}); building without a lock")
        chosen = options.source_date_epoch
        return chosen if chosen is not None else (entry.source_date_epoch if entry else None)
    moved = drift(entry, current) if entry else []
    report.lock = record = LockRecord(
        file=str(lock_path),
        pair=current.key,
        in_lock=entry is not None,
        matches=entry is not None and not moved,
        drift=[DriftRecord(**asdict(d)) for d in moved],
        notes=notes(entry, current) if entry else [],
        entries=entry or current,
    )
    for line in [str(d) for d in moved] + record.notes:
        sink(f"forge: lock: {line}")
    if options.locked and entry is not None:
        check_drift(entry, current, lock_path)
    if options.source_date_epoch is not None:
        return options.source_date_epoch
    return (entry or current).source_date_epoch


def sbom_phase(engine: Engine, image: str, folder: Path, report: Recorded, epoch: int | None, sink: Sink) -> None:
    """Write the SBOM beside the report and record its digest; a failure is recorded, not fatal: the image stands."""
    try:
        result = write_sbom(
            engine,
            image,
            folder,
            distro=report.distro,
            target=report.target,
            source_date_epoch=epoch,
            name=image.rsplit(":", 1)[0],
        )
    except ForgeError as exc:
        report.sbom = SbomFailed(error=exc.message)
        sink(f"forge: sbom not written: {exc.message.splitlines()[0]}")
        return
    report.sbom = SbomRecord(
        **result.to_report(),
        image_id=report.image.id if report.image else None,
        label={SBOM_LABEL: sbom_label(report.distro, report.target)[SBOM_LABEL]},
    )
    sink(f"forge: sbom {result.path} ({result.os_packages} OS packages, {result.python_packages} Python packages)")
