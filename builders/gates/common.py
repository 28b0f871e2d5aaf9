"""The gates every build has, whichever engine it builds (disk, scratch, RAM), and the phases that gather their
facts and the pinned source the engine's own gates read. Each phase is `phase(ctx)` over a PreflightContext
(context.py) and puts what it found back into it; an engine's `preflight` (builders/engines/serving.py) runs
them in its order around its own gates. The gates themselves are pure: facts in, a Finding out.
"""

from __future__ import annotations

import time
from pathlib import Path

from builders.config.models import Recipe
from builders.container import Engine
from builders.errors import SourceUnavailable
from builders.gates.context import PreflightContext
from builders.gates.findings import Finding, blocker, passed, unchecked, warning
from builders.gates.host import GIB, HostFacts, Memory, Mount, derive_max_jobs, free_bytes, mount_for
from builders.sources import cache_dir, fetch_sdist


def _gb(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def disk_gate(*, gate: str, where: str, free: int, need_gb: float, need_source: str, remedy: str) -> Finding:
    found = f"{_gb(free)} free at {where}"
    required = f"≥ {need_gb:g} GiB"
    if free >= need_gb * GIB:
        return passed(gate, found, required, need_source)
    return blocker(
        gate,
        found,
        required,
        need_source,
        remedy,
        f"the build would run out of space at {where} after minutes of compiling",
    )


def tmpfs_gate(*, scratch_dir: Path, mount: Mount | None, need_gb: float, mem_total: int, need_source: str) -> Finding:
    if mount is None or mount.fstype != "tmpfs":
        kind = f"{mount.fstype} at {mount.mountpoint}" if mount else "unknown filesystem"
        return passed("scratch-tmpfs", f"{scratch_dir} on {kind}", "disk-backed scratch dir", "host /proc/mounts")
    size = mount.size_bytes or mem_total // 2  # tmpfs defaults to half of RAM (Debian 13's /tmp)
    found = f"{scratch_dir} on tmpfs {mount.mountpoint} ({_gb(size)}, held in RAM)"
    remedy = "stage on disk instead: --scratch-dir /var/tmp/forge (any disk-backed directory)"
    message = "a tmpfs scratch dir spends the RAM the compile jobs need"
    if size < need_gb * GIB:
        return blocker(
            "scratch-tmpfs",
            found,
            f"disk-backed, ≥ {need_gb:g} GiB",
            f"host /proc/mounts; {need_source}",
            remedy,
            message + f", and is smaller than the {need_gb:g} GiB the build stages",
        )
    return warning("scratch-tmpfs", found, "disk-backed scratch dir", "host /proc/mounts", remedy, message)


def ram_gate(
    *,
    memory: Memory,
    max_jobs: int,
    jobs_origin: str,
    per_job_gb: float,
    per_job_source: str,
    cores: int,
    reserved: int = 0,
    reserved_why: str = "",
) -> Finding:
    usable = max(memory.available - reserved, 0)
    need = max_jobs * per_job_gb * GIB
    found = f"{_gb(usable)} available" + (f" ({_gb(reserved)} held by {reserved_why})" if reserved else "")
    required = f"{max_jobs} job(s) × {per_job_gb:g} GiB = {_gb(need)}"
    source = f"{memory.source}; {per_job_source}"
    if need <= usable:
        return passed("ram", found, required, source, f"MAX_JOBS={max_jobs} ({jobs_origin})")
    fit = derive_max_jobs(usable, cores, per_job_gb)
    if usable >= per_job_gb * GIB:
        remedy = f"build with --max-jobs {fit} (what fits), or free memory"
    else:
        remedy = f"free memory: even one compile job needs {per_job_gb:g} GiB"
    return blocker(
        "ram", found, required, source, remedy, f"MAX_JOBS={max_jobs} ({jobs_origin}) would get compile jobs OOM-killed"
    )


# --- phases ------------------------------------------------------------------------------------------------


def default_source_path(root: Path, recipe: Recipe) -> Path | None:
    """The recipe's pinned sdist in the source cache (`forge fetch` puts it there), if present."""
    if recipe.source is None or recipe.source.pypi is None:
        return None
    pin = recipe.source.pypi
    path = cache_dir(root) / f"{pin.name}-{pin.version}.tar.gz"
    return path if path.is_file() else None


def fetch_source(ctx: PreflightContext) -> None:
    """The source the gates read: given, cached, or fetched now (sha256-checked, into `forge fetch`'s cache);
    else `ctx.source` stays None and `ctx.source_why` says why it could not be had."""
    recipe, progress = ctx.recipe, ctx.progress
    if ctx.given_source is not None:
        ctx.source = ctx.given_source
        return
    ctx.source = default_source_path(ctx.root, recipe)
    if ctx.source is not None:
        return
    pin = recipe.source.pypi if recipe.source else None
    if pin is None:
        ctx.source_why = "the recipe pins no PyPI sdist"
        return
    if not ctx.fetch:
        ctx.source_why = "not in the source cache and fetching was not asked for"
        return
    progress(
        f"preflight: fetching {pin.name} {pin.version} sdist from PyPI into {cache_dir(ctx.root)} (sha256-checked)"
    )
    start = time.monotonic()
    try:
        got = fetch_sdist(recipe, ctx.root)
    except SourceUnavailable as exc:
        progress(f"preflight: could not fetch {pin.name} {pin.version}: {exc.message}")
        ctx.source_why = exc.message
        return
    size = got.path.stat().st_size / 1e6
    progress(f"preflight: fetched {got.path.name} ({size:.0f} MB) in {time.monotonic() - start:.1f} s")
    ctx.source = got.path


def measure_disk(ctx: PreflightContext) -> None:
    """Layer storage and scratch space into `ctx.disk` (the engine places them in its report), and the RAM a
    tmpfs scratch dir would take from the compile jobs into `ctx.reserved`."""
    recipe, engine, scratch_dir, host = ctx.recipe, ctx.engine, ctx.scratch_dir, ctx.host
    out: list[Finding] = []
    res = recipe.resources
    yaml = f"recipes/{recipe.name}.yaml"
    root = engine.root_dir if engine else None
    if root and Path(root).is_dir():
        free, where = free_bytes(Path(root))
        out.append(
            disk_gate(
                gate="disk-layers",
                where=str(where),
                free=free,
                need_gb=res.disk_gb,
                need_source=f"{yaml}: resources.disk_gb",
                remedy=f"free space under {root} (`docker builder prune`, `docker image prune`) or move the engine's "
                "data-root to a bigger disk",
            )
        )
    elif root:
        out.append(
            unchecked(
                "disk-layers",
                f"engine data root {root} not visible from here",
                f"≥ {res.disk_gb:g} GiB",
                f"{yaml}: resources.disk_gb",
                f"check free space where the engine keeps {root}",
                "the engine runs elsewhere (a VM or remote host): its disk was not checked",
            )
        )
    else:
        out.append(
            unchecked(
                "disk-layers",
                "no engine connected",
                f"≥ {res.disk_gb:g} GiB",
                f"{yaml}: resources.disk_gb",
                "start the engine and rerun to check its layer storage",
            )
        )
    free, where = free_bytes(scratch_dir)
    out.append(
        disk_gate(
            gate="disk-scratch",
            where=str(where),
            free=free,
            need_gb=res.scratch_gb,
            need_source=f"{yaml}: resources.scratch_gb",
            remedy=f"pass --scratch-dir on a filesystem with ≥ {res.scratch_gb:g} GiB free",
        )
    )
    mount = mount_for(scratch_dir, list(host.mounts))
    out.append(
        tmpfs_gate(
            scratch_dir=scratch_dir,
            mount=mount,
            need_gb=res.scratch_gb,
            mem_total=host.memory.total,
            need_source=f"{yaml}: resources.scratch_gb",
        )
    )
    out += _builder_scratch_findings(engine, scratch_dir, host, res.scratch_gb, f"{yaml}: resources.scratch_gb")
    ctx.disk = out
    ctx.reserved = int(res.scratch_gb * GIB) if mount is not None and mount.fstype == "tmpfs" else 0


def _builder_scratch_findings(
    engine: Engine | None, scratch_dir: Path, host: HostFacts, need_gb: float, need_source: str
) -> list[Finding]:
    """Where the engine's builder stages on this host (buildah: TMPDIR, else /var/tmp), when not the scratch dir's
    filesystem: it holds each layer's tarball while it is committed, and is a tmpfs on some hosts."""
    out: list[Finding] = []
    scratch_mount = mount_for(scratch_dir, list(host.mounts))
    for folder in engine.facts.scratch_dirs if engine else ():
        path = Path(folder)
        mount = mount_for(path, list(host.mounts))
        if not path.is_dir() or (mount is not None and mount == scratch_mount):
            continue
        free, where = free_bytes(path)
        remedy = f"give the builder a disk-backed TMPDIR with ≥ {need_gb:g} GiB free"
        out.append(
            disk_gate(
                gate="disk-builder-scratch",
                where=str(where),
                free=free,
                need_gb=need_gb,
                need_source=need_source,
                remedy=remedy,
            )
        )
        if mount is not None and mount.fstype == "tmpfs":
            out.append(
                warning(
                    "builder-scratch-tmpfs",
                    f"{folder} on tmpfs {mount.mountpoint}",
                    "disk-backed builder scratch dir",
                    "host /proc/mounts; podman info store.imageCopyTmpDir",
                    remedy,
                    "the builder stages layers in RAM the compile jobs need",
                )
            )
    return out


def report_disk(ctx: PreflightContext) -> None:
    ctx.findings += ctx.disk


def count_jobs(ctx: PreflightContext, *, compiles: bool = True) -> None:
    """The compile jobs the RAM gate judges, and where that number comes from: --max-jobs, the recipe, else what
    the host's available RAM (less a tmpfs scratch dir's share) and cores allow."""
    recipe, host = ctx.recipe, ctx.host
    usable = max(host.memory.available - ctx.reserved, 0)
    if not compiles:
        ctx.max_jobs, ctx.jobs_origin = 1, "no compile: one install step"
    elif ctx.given_jobs is not None:
        ctx.max_jobs, ctx.jobs_origin = ctx.given_jobs, "--max-jobs"
    elif recipe.max_jobs is not None:
        ctx.max_jobs, ctx.jobs_origin = recipe.max_jobs, f"recipes/{recipe.name}.yaml: max_jobs"
    else:
        ctx.max_jobs = derive_max_jobs(usable, host.cores, recipe.resources.ram_per_job_gb)
        ctx.jobs_origin = f"derived from {usable / GIB:.1f} GiB and {host.cores} core(s)"


def check_ram(ctx: PreflightContext) -> None:
    """RAM for the compile jobs: the same gate for every engine's build."""
    recipe, host = ctx.recipe, ctx.host
    assert ctx.max_jobs is not None, "count_jobs runs first"
    ctx.findings.append(
        ram_gate(
            memory=host.memory,
            max_jobs=ctx.max_jobs,
            jobs_origin=ctx.jobs_origin,
            per_job_gb=recipe.resources.ram_per_job_gb,
            per_job_source=f"recipes/{recipe.name}.yaml: resources.ram_per_job_gb",
            cores=host.cores,
            reserved=ctx.reserved,
            reserved_why="the tmpfs scratch dir" if ctx.reserved else "",
        )
    )
