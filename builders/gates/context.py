"""What preflight's phases share: the pair and the build host, what the build was told, and what each phase has
found so far. `run_preflight` (builders/preflight/runner.py) makes one and hands it to the recipe's serving
engine, whose `preflight(ctx)` runs its own gates and the ones every build shares (common.py), each
`phase(ctx)`; what a phase finds goes back into the context, and the report is made from it at the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from builders.config.models import Distro, GpuMode, Recipe, TorchIndex
from builders.container import Engine
from builders.gates.findings import Finding, PreflightReport
from builders.gates.host import HostFacts
from builders.target import Target

Progress = Callable[[str], None]


@dataclass(kw_only=True)
class PreflightContext:
    """The inputs of one preflight, then what its phases found. Gates read `source` (the pinned source, once a
    phase has it at hand, else None and `source_why`), `max_jobs` (the compile jobs the RAM gate judges, once
    counted) and `run_flags` (the CPU flags of the host the image will run on)."""

    root: Path  # the project: its source cache
    distros: Mapping[str, Distro]  # every distro, for a remedy that names another one
    target: Target
    engine: Engine | None  # the container engine, None when none answers (declared facts only, and said so)
    given_source: Path | None  # --source: a tree or sdist to read instead of the pinned one
    given_jobs: int | None  # --max-jobs
    scratch_dir: Path
    probe: bool  # probe the base image, not only its declared facts
    run_flags: frozenset[str]
    run_source: str
    wheelhouse: Sequence[Path]
    host: HostFacts
    gpu_mode: GpuMode | None
    torch_index: TorchIndex | None
    torch_version: str | None
    fetch: bool  # fetch the pinned source into the cache when it is not there
    progress: Progress
    # --source NAME=PATH besides the engine's own: checkouts an engine's build needs (sgl-kernel), read by its gates.
    given_sources: Mapping[str, Path] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    findings: list[Finding] = field(default_factory=list)
    source: Path | None = None
    source_why: str = ""  # why source is None
    max_jobs: int | None = None
    jobs_origin: str = ""
    reserved: int = 0  # RAM a tmpfs scratch dir takes from the compile jobs
    disk: list[Finding] = field(default_factory=list)  # the disk gates' findings, placed where the engine reports them
    mode: Literal["probed", "declared"] = "declared"
    probe_image: str | None = None
    version: str | None = None  # the engine's version as its source states it

    @property
    def distro(self) -> Distro:
        return self.target.distro

    @property
    def recipe(self) -> Recipe:
        return self.target.recipe

    def report(self) -> PreflightReport:
        """The report of what the phases found, in the order they found it."""
        return PreflightReport.from_findings(
            self.findings,
            distro=self.distro.name,
            target=self.recipe.target,
            recipe=self.recipe.name,
            mode=self.mode,
            seconds=time.monotonic() - self.started,
            vllm_version=self.version,
            source=str(self.source) if self.source else None,
            max_jobs=self.max_jobs,
            probe_image=self.probe_image,
        )
