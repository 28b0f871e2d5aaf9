"""run_preflight: one PreflightContext for a distro × recipe, handed to the recipe's serving engine, whose
`preflight(ctx)` runs its own gates and the ones every build shares; the report is made from what they found.

The build executor calls this as its preflight phase; `forge preflight` calls it on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from builders.config.models import Distro, GpuMode, Recipe, TorchIndex
from builders.container import Engine
from builders.engines import ENGINES
from builders.gates.context import PreflightContext, Progress
from builders.gates.findings import PreflightReport
from builders.gates.host import HostFacts, read_host_facts
from builders.project import Project
from builders.target import Target


def run_preflight(
    project: Project,
    distro: Distro,
    recipe: Recipe,
    *,
    engine: Engine | None,
    source: Path | None,
    max_jobs: int | None,
    scratch_dir: Path,
    probe: bool = True,
    run_host_flags: frozenset[str] | None = None,
    run_host_source: str | None = None,
    wheelhouse: Sequence[Path] = (),
    host: HostFacts | None = None,
    gpu_mode: GpuMode | None = None,
    torch_index: TorchIndex | None = None,
    torch_version: str | None = None,
    fetch: bool = False,
    progress: Progress = lambda _line: None,
    given_sources: Mapping[str, Path] | None = None,
) -> PreflightReport:
    """Every gate for building `recipe` on `distro` here. A failed gate never raises: the report says, and a gate
    that could not be evaluated makes it incomplete, never clear.

    engine: the container engine (None: declared facts only, and the report says so). source, max_jobs: --source
    and --max-jobs. run_host_flags: the CPU flags of the host the image will run on (default: this one's).
    gpu_mode, torch_index, torch_version: what the build was told, else the recipe's. fetch: download the pinned
    source into the source cache when it is not there (progress says so). given_sources: the other --source
    NAME=PATH, checkouts an engine's gates read (sgl-kernel). Raises SourceUnavailable only when an explicitly
    given source cannot be read.
    """
    host = host or read_host_facts()
    ctx = PreflightContext(
        root=project.root,
        distros=project.distros,
        target=Target.resolve(distro, recipe, gpu_mode=gpu_mode),
        engine=engine,
        given_source=source,
        given_jobs=max_jobs,
        scratch_dir=scratch_dir,
        probe=probe,
        run_flags=run_host_flags if run_host_flags is not None else host.cpu_flags,
        run_source=run_host_source or "build host /proc/cpuinfo",
        wheelhouse=wheelhouse,
        host=host,
        gpu_mode=gpu_mode,
        torch_index=torch_index,
        torch_version=torch_version,
        fetch=fetch,
        progress=progress,
        given_sources=given_sources or {},
    )
    ENGINES.of(recipe).preflight(ctx)
    return ctx.report()
