"""What a build's phases share (builders/build.py): one `Context`, its inputs, the report the phases fill in, and
what each phase leaves for the next. Every phase is `phase(ctx)` and puts what it produces back here; how a
build starts and ends (the report written whatever happens, an unproven image removed) is build.py's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from builders.bootstrap import BaseResult
from builders.cache.phase import CachePlan
from builders.config.models import Distro, Recipe
from builders.container import Builder, Engine
from builders.engines import ENGINES, ServingEngine
from builders.log import Log
from builders.options import BuildOptions
from builders.plan import BuildPlan
from builders.project import Project
from builders.rebuild.devtree import TreeSplit
from builders.report import BuildReport
from builders.sources import ResolvedSource
from builders.target import Target


@dataclass(kw_only=True)
class Context:
    """The inputs, the report, and each phase's result; a field ending in `_` is read through its property,
    which says which phase must have run first."""

    project: Project
    distro: Distro
    recipe: Recipe
    options: BuildOptions
    log: Log
    report: BuildReport
    reports_dir: Path
    target: Target
    max_jobs: int
    ca_bundle: Path | None
    engine_: Engine | None = None
    builder_: Builder | None = None
    base: BaseResult | None = None
    wheelhouse: Path | None = None
    source: ResolvedSource | None = None  # the recipe's pinned source (its sdist, or a tree given with --source)
    sources: dict[str, ResolvedSource] = field(default_factory=dict)  # the sources CMake would fetch, by name
    tree: TreeSplit | None = None  # a source tree, split into the parts a rebuild reuses
    torch_pin: str | None = None
    source_version: str | None = None  # the engine's version as its source states it
    epoch: int | None = None
    plan_: BuildPlan | None = None
    context_dir: Path | None = None
    image_id: str | None = None  # built but not yet proven: removed unless the build gets to keep it
    running: str | None = None  # the phase under way, and since when
    phase_started: float = 0.0
    cache: CachePlan | None = None  # --compiler-cache / --cache-registry: builders/cache/phase.py

    @property
    def engine_of(self) -> ServingEngine:
        """The serving engine the recipe builds (not the container engine, `engine`)."""
        return ENGINES.of(self.recipe)

    @property
    def compiles(self) -> bool:
        """Whether this build compiles C, C++ or CUDA (the serving engine says: llama.cpp and SGLang's CPU kernels
        do too, not only vLLM's source builds)."""
        return self.engine_of.compiles(self.target)

    @property
    def engine(self) -> Engine:
        assert self.engine_ is not None, "the engine phase runs first"
        return self.engine_

    @property
    def builder(self) -> Builder:
        assert self.builder_ is not None, "the engine phase runs first"
        return self.builder_

    @property
    def plan(self) -> BuildPlan:
        assert self.plan_ is not None, "the plan phase runs before the stages that read it"
        return self.plan_

    @property
    def log_path(self) -> Path:
        return self.reports_dir / "build.log"
