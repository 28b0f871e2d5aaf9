"""What a build of one distro × target would consume now, resolved from local state only: no network.

The same function feeds `forge lock` (to write the entry) and `forge build` (to compare with it), so a
lock and a build can never disagree on how an input is hashed.
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
import zipfile
from calendar import timegm
from pathlib import Path

from builders.bootstrap import DEFAULT_EPOCH
from builders.config.models import Distro, Recipe, TorchIndex
from builders.container import Engine
from builders.engines import ENGINES
from builders.errors import SourceUnavailable
from builders.project import Project
from builders.repro.image_export import image_rootfs
from builders.repro.lockfile import ArchiveLock, BaseLock, PairLock, RequirementsLock, TreeLock, WheelLock
from builders.sources import cache_dir, resolve_fetched, sha256_file, wheelhouse_dir
from builders.target import Target

# Paths _stage_context leaves out of a source tree's copy: they are not part of what the build sees.
TREE_IGNORED = {".git", ".forge-origin"}


def tree_sha256(root: Path) -> tuple[str, int]:
    """A content hash of a source tree: sorted relative paths, their kind, exec bit and content or link target.

    Owners, full modes and mtimes are left out: a checkout's and an unpacked package's differ in those alone.
    """
    digest = hashlib.sha256()
    count = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in TREE_IGNORED)
        base = Path(folder)
        for name in sorted(files + [d for d in dirs if (base / d).is_symlink()]):
            if name in TREE_IGNORED:
                continue
            path = base / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                line = f"L {rel} {path.readlink()}"
            else:
                executable = "x" if path.stat().st_mode & 0o111 else "-"
                line = f"F {rel} {executable} {sha256_file(path)}"
            digest.update(line.encode() + b"\n")
            count += 1
        for name in dirs:
            if not (base / name).is_symlink():
                digest.update(f"D {(base / name).relative_to(root).as_posix()}\n".encode())
                count += 1
    return digest.hexdigest(), count


def project_name(filename: str) -> str:
    return re.sub(r"[-_.]+", "-", filename.split("-", 1)[0]).lower()


def wheel_version(filename: str) -> str:
    return filename.split("-")[1]


def _base_lock(distro: Distro, engine: Engine) -> BaseLock:
    ref = distro.base.local_tag
    if not engine.image_exists(ref):
        raise SourceUnavailable(
            f"base {ref} is not in the engine",
            hint=f"run `forge bootstrap {distro.name}` (or pull {distro.base.pinned_ref}), then lock again",
        )
    info = engine.image_info(ref)
    digest = distro.base.digest
    return BaseLock(
        ref=ref,
        declared=distro.base.pinned_ref,
        how="registry" if digest else "local",
        rootfs=image_rootfs(engine, ref),
        registry_digest=digest,
        image_id=info.id,
    )


def _sdist(project: Project, recipe: Recipe, overrides: dict[str, Path]) -> Path:
    assert recipe.source is not None
    if "vllm" in overrides:
        if overrides["vllm"].is_dir():
            # A tree being edited has no one hash to pin: the build goes on unlocked (refused under --locked).
            raise SourceUnavailable(
                f"--source vllm={overrides['vllm']} is a source tree: forge.lock pins sdists, not trees",
                hint="build the tree without --locked, or lock the pinned sdist (no --source)",
            )
        return overrides["vllm"]
    if recipe.source.pypi is None:
        raise SourceUnavailable("a git source is locked from a checkout", hint="pass --source vllm=PATH")
    pin = recipe.source.pypi
    path = cache_dir(project.root) / f"{pin.name}-{pin.version}.tar.gz"
    if not path.exists():
        raise SourceUnavailable(
            f"{path.name} is not in the source cache",
            hint=f"run `forge fetch DISTRO {recipe.target} vllm`, then lock again",
        )
    return path


def sdist_epoch(sdist: Path) -> int:
    """The sdist's newest member mtime: when the release was made, as its archive records it."""
    with tarfile.open(sdist) as tar:
        return max((int(m.mtime) for m in tar.getmembers()), default=DEFAULT_EPOCH)


def wheel_epoch(wheel: Path) -> int | None:
    """The date a wheel's METADATA was written; None for wheels built with a zeroed (1980) date."""
    with zipfile.ZipFile(wheel) as zf:
        infos = [i for i in zf.infolist() if i.filename.endswith(".dist-info/METADATA")]
    if not infos or infos[0].date_time[0] <= 1980:
        return None
    return timegm((*infos[0].date_time, 0, 0, 0))


def resolve_pair(
    project: Project,
    distro: Distro,
    recipe: Recipe,
    engine: Engine,
    *,
    source_overrides: dict[str, Path] | None = None,
    wheelhouse: Path | None = None,
    torch_version: str | None = None,
    torch_index: TorchIndex | None = None,
) -> PairLock:
    """Resolve every input of this pair from local state; stop naming every missing one at once."""
    overrides = source_overrides or {}
    # The recipe's cuda.mode, like the lock: a lock names every input either GPU mode could read.
    target = Target.resolve(distro, recipe)
    engine_of = ENGINES.of(recipe)
    missing: list[str] = []
    base: BaseLock | None = None
    try:
        base = _base_lock(distro, engine)
    except SourceUnavailable as exc:
        missing.append(f"{exc.message} ({exc.hint})")
    archives: list[ArchiveLock] = []
    trees: list[TreeLock] = []
    wheels: list[WheelLock] = []
    requirements: list[RequirementsLock] = []
    epoch, epoch_from = DEFAULT_EPOCH, "Forge's default epoch (the one bases are bootstrapped with)"

    if target.pinned_source:
        # The engine's pinned archive, and what it says the build installs from an index (nothing, for an engine
        # whose archive is all it builds from).
        try:
            sdist = _sdist(project, recipe, overrides)
            archives.append(ArchiveLock(name=engine_of.name, file=sdist.name, sha256=sha256_file(sdist)))
            requirements += [
                RequirementsLock(name=r.name, origin=r.origin, hashed=r.hashed, lines=r.lines)
                for r in engine_of.locked_requirements(
                    project.containers_dir, target, sdist, torch_version=torch_version, torch_index=torch_index
                )
            ]
            epoch, epoch_from = sdist_epoch(sdist), f"{sdist.name}: newest member's mtime (release date)"
        except SourceUnavailable as exc:
            missing.append(f"{exc.message} ({exc.hint})")
        for fetched in recipe.fetched_sources:
            try:
                got = resolve_fetched(fetched, project.root, overrides)
            except SourceUnavailable:
                missing.append(
                    f"{fetched.name}: not in the source cache (run `forge fetch {distro.name} "
                    f"{recipe.target} {fetched.name}` or pass --source {fetched.name}=PATH)"
                )
                continue
            digest, count = tree_sha256(got.path)
            trees.append(
                TreeLock(name=fetched.name, tree_sha256=digest, files=count, version=got.version, origin=got.origin)
            )

    if target.from_wheelhouse:
        assert recipe.wheelhouse is not None
        folder = wheelhouse or wheelhouse_dir(project.root, distro, recipe)
        found = sorted(folder.glob("*.whl")) if folder.is_dir() else []
        if not found:
            missing.append(
                f"no wheels in {folder} (run `forge fetch {distro.name} {recipe.target}` or pass --wheelhouse DIR)"
            )
        excluded = {re.sub(r"[-_.]+", "-", e).lower() for e in recipe.wheelhouse.exclude}
        pinned: list[str] = []
        for wheel in found:
            installed = project_name(wheel.name) not in excluded
            sha = sha256_file(wheel)
            wheels.append(WheelLock(file=wheel.name, sha256=sha, installed=installed))
            if installed:
                pinned.append(f"{project_name(wheel.name)}=={wheel_version(wheel.name)} --hash=sha256:{sha}")
        requirements.append(
            RequirementsLock(
                name="runtime",
                origin=f"wheelhouse {folder.name}: every wheel but {', '.join(sorted(excluded)) or 'none'}",
                hashed=True,
                lines=tuple(pinned),
            )
        )
        first = re.sub(r"[-_.]+", "-", re.split(r"[=<>!~ ;\[]", recipe.wheelhouse.requirements[0])[0]).lower()
        main = [w for w in found if project_name(w.name) == first]
        stamped = wheel_epoch(main[0]) if main else None
        if stamped is not None:
            epoch, epoch_from = stamped, f"{main[0].name}: METADATA date (release date)"

    if target.python_app:
        requirements.append(
            RequirementsLock(
                name="app",
                origin=f"recipes/{recipe.name}.yaml app_requirements: unpinned, pip resolves them at "
                "build time (no offline resolution without an index)",
                hashed=False,
                lines=tuple(recipe.app_requirements),
            )
        )

    if missing or base is None:
        raise SourceUnavailable(
            f"cannot lock {distro.name} {recipe.target}; missing:\n  - " + "\n  - ".join(missing),
            hint="provide each input as its line says, then run `forge lock` again",
        )
    return PairLock(
        distro=distro.name,
        target=recipe.target,
        recipe=recipe.name,
        source_date_epoch=epoch,
        epoch_from=epoch_from,
        base=base,
        archives=tuple(archives),
        trees=tuple(sorted(trees, key=lambda t: t.name)),
        wheels=tuple(wheels),
        requirements=tuple(sorted(requirements, key=lambda r: r.name)),
    )
