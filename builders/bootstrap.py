"""Bases built from a distro's package archive (mmdebstrap, dnf --installroot) and loaded into the engine.

A base made here depends on nothing but the archive: no registry, and with a snapshot mirror and
SOURCE_DATE_EPOCH the same bytes every time.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from builders.config.models import Distro
from builders.container import Engine
from builders.diagnose.diagnosis import diagnose_text
from builders.distros import family_for
from builders.errors import BaseUnavailable
from builders.platforms import platform_of

# Fixed so that two bootstraps of the same archive state give the same tarball.
DEFAULT_EPOCH = 1735689600  # 2025-01-01T00:00:00Z


@dataclass(frozen=True, kw_only=True)
class BaseResult:
    ref: str
    image_id: str
    how: str  # "local", "pulled", "bootstrapped"
    seconds: float
    rootfs_sha256: str | None = None


def bootstrap(
    distro: Distro, engine: Engine, *, source_date_epoch: int | None = None, scratch: Path | None = None
) -> BaseResult:
    boot = distro.base.bootstrap
    if boot is None:
        raise BaseUnavailable(
            f"distros/{distro.name}.yaml has no base.bootstrap: this base can only be pulled",
            hint=f"pull {distro.base.image} where its registry is reachable",
        )
    family = family_for(distro)
    tool = boot.tool
    if shutil.which(tool) is None:
        raise BaseUnavailable(
            f"bootstrapping {distro.name} needs `{tool}`, which is not installed here",
            hint=f"install it (Debian: apt-get install {tool}) or pull {distro.base.image} instead",
        )
    if boot.keyring and not Path(boot.keyring).exists():
        raise BaseUnavailable(
            f"bootstrapping {distro.name} needs the keyring {boot.keyring}, which is missing",
            hint="install the distro's archive keyring package (ubuntu-keyring)",
        )
    epoch = source_date_epoch if source_date_epoch is not None else DEFAULT_EPOCH
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="forge-bootstrap-", dir=scratch) as tmp:
        tar = Path(tmp) / f"{distro.name}.tar"
        cmd = family.bootstrap_command(str(tar), source_date_epoch=epoch)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        output = (proc.stderr or "") + (proc.stdout or "")
        stale = stale_tempdir(output) if proc.returncode != 0 and tar.exists() else None
        if stale is not None:
            # The tarball was complete and only mmdebstrap's own tempdir removal failed: remove what it left
            # (a /proc still mounted in the host's namespace, and the tree under it) rather than the base.
            remove_stale_tempdir(stale)
        elif proc.returncode != 0 or not tar.exists():
            raise bootstrap_failure(distro, output)
        digest = hashlib.sha256(tar.read_bytes()).hexdigest()
        engine.import_rootfs(
            str(tar), distro.base.local_tag, changes=['CMD ["/bin/sh"]'], platform=platform_of(distro).name
        )
    info = engine.image_info(distro.base.local_tag)
    return BaseResult(
        ref=distro.base.local_tag,
        image_id=info.id,
        how="bootstrapped",
        seconds=time.monotonic() - start,
        rootfs_sha256=digest,
    )


# mmdebstrap (root mode) writes the tarball, prints "I: done", and only then removes its tempdir. On a loaded CI
# host (issue 34) the chroot's /proc was still mounted at that point: `rm` skipped it ("on a different device")
# and mmdebstrap exited 1 after a complete tarball.
_TEMPDIR_REMOVAL = re.compile(r"^I: removing tempdir (/\S+?)\.\.\.$", re.MULTILINE)


def stale_tempdir(output: str) -> Path | None:
    """The tempdir mmdebstrap failed to remove, where that removal is the only thing that failed: the tarball
    was written ("I: creating tarball" then "I: done") and every error line comes after the removal began."""
    removal = _TEMPDIR_REMOVAL.search(output)
    if removal is None:
        return None
    before, after = output[: removal.start()], output[removal.end() :]
    done = before.rfind("I: creating tarball")
    if done < 0 or "I: done" not in before[done:] or re.search(r"^E: ", before, re.MULTILINE):
        return None
    if not re.search(r"^E: rm failed", after, re.MULTILINE):
        return None
    path = Path(removal.group(1))
    # Only mmdebstrap's own tempdirs: the path comes from a tool's output and is about to be removed.
    return path if path.name.startswith("mmdebstrap.") and path.parent == Path(tempfile.gettempdir()) else None


def remove_stale_tempdir(path: Path) -> None:
    """Unmount what is still mounted under mmdebstrap's tempdir (lazily: a process may still hold /proc), then
    remove the tree without crossing into a mount."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m == str(path) or m.startswith(f"{path}/")), reverse=True):
        subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], capture_output=True, check=False)


# The causes a bootstrap can name from the tool's own output. The words that tell them apart (an expired archive
# is not an unreachable one, a clock behind is not an expired archive) live once, in the diagnosis rules.
BOOTSTRAP_CAUSES = ("release-expired", "release-not-yet-valid", "archive-key", "mirror-unreachable")


def bootstrap_failure(distro: Distro, output: str) -> BaseUnavailable:
    """Why a bootstrap failed, with the remedy for that cause, from the same rules `forge diagnose` uses."""
    boot = distro.base.bootstrap
    assert boot is not None
    where = f"distros/{distro.name}.yaml"
    diagnosis = diagnose_text(output)
    if diagnosis.category in BOOTSTRAP_CAUSES:
        cause = " ".join(diagnosis.cause.split())
        remedy = " ".join(diagnosis.remedy.split()).replace("distros/<name>.yaml", where)
        return BaseUnavailable(
            f"could not bootstrap {distro.name} from {boot.mirror}: {diagnosis.category}\n"
            f"    {(diagnosis.line or '').strip()}\n  {cause}",
            hint=remedy,
        )
    tail = "\n    ".join(output.strip().splitlines()[-6:])
    return BaseUnavailable(
        f"could not bootstrap {distro.name} from {boot.mirror}:\n    {tail}",
        hint=f"`forge diagnose` on the whole output names the causes it knows; or load an image tagged "
        f"{distro.base.local_tag}",
    )


def registry_of(ref: str) -> str:
    """The registry a reference is pulled from: its first component when that names a host, else Docker Hub."""
    first, sep, _ = ref.partition("/")
    return first if sep and ("." in first or ":" in first or first == "localhost") else "docker.io"


def _pull(
    engine: Engine, ref: str, local_tag: str | None, start: float, platform: str | None = None
) -> BaseResult | str:
    """The pulled image (tagged local_tag when given), or why the pull failed, naming the registry."""
    try:
        engine.pull(ref, platform=platform)
        if local_tag:
            engine.tag(ref, local_tag)
        info = engine.image_info(local_tag or ref)
        return BaseResult(ref=local_tag or ref, image_id=info.id, how="pulled", seconds=time.monotonic() - start)
    except Exception as exc:  # the engine reports unreachable registries in several shapes
        return f"pull {ref}: registry {registry_of(ref)} unreachable or refused ({exc})"


def ensure_image(engine: Engine, ref: str, *, allow_pull: bool = True) -> BaseResult:
    """An image by reference (a CUDA base from NVIDIA's registry): local if present, else pulled; else stop at
    once naming the registry that could not be reached."""
    start = time.monotonic()
    if engine.image_exists(ref):
        return BaseResult(ref=ref, image_id=engine.image_info(ref).id, how="local", seconds=0.0)
    pulled = _pull(engine, ref, None, start) if allow_pull else "pull disabled"
    if isinstance(pulled, BaseResult):
        return pulled
    raise BaseUnavailable(
        f"no image {ref}:\n  - {pulled}",
        hint=f"pull {ref} where {registry_of(ref)} is reachable, or `docker load` an image tagged {ref}",
    )


def ensure_base(distro: Distro, engine: Engine, *, allow_bootstrap: bool = True, allow_pull: bool = True) -> BaseResult:
    """A local base if present, else pulled, else bootstrapped; else stop at once saying what was unreachable."""
    start = time.monotonic()
    if engine.image_exists(distro.base.local_tag):
        info = engine.image_info(distro.base.local_tag)
        return BaseResult(ref=distro.base.local_tag, image_id=info.id, how="local", seconds=0.0)
    problems: list[str] = []
    if allow_pull:
        pulled = _pull(engine, distro.base.pinned_ref, distro.base.local_tag, start, platform_of(distro).name)
        if isinstance(pulled, BaseResult):
            return pulled
        problems.append(pulled)
    if allow_bootstrap and distro.base.bootstrap:
        try:
            return bootstrap(distro, engine)
        except BaseUnavailable as exc:
            problems.append(exc.message)
    raise BaseUnavailable(
        f"no base image for {distro.name}:\n  - " + "\n  - ".join(problems or ["bootstrap and pull disabled"]),
        hint=f"run `forge bootstrap {distro.name}` where its package mirror is reachable, pull "
        f"{distro.base.pinned_ref} where its registry is, or `docker load` an image tagged {distro.base.local_tag}",
    )
