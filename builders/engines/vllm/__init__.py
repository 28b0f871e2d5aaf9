"""vLLM: what Forge knows about it, behind the one interface (`Vllm`, registered in builders/engines/__init__.py).

Its images are planned in plan.py (the CPU image, compiled from the sdist or installed from a wheelhouse, with the
router's image riding the same plan; the CUDA image on NVIDIA's bases) and gpu_wheel.py (the CUDA image from
PyPI's wheels). Its preflight is preflight.py, over gates.py and what source_facts.py (with cmake_script.py),
probe.py, torch_index.py and arm_gates.py read; its test stage is image_tests.py (and gpu_wheel.py's checks); the
dev loop's tree parts and reuse report are devtree.py and devloop.py; what forge.lock records of its source is
lock.py; and how a pool serves it is serve.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from builders.config.models import Distro, Recipe, TorchIndex
from builders.container import Engine
from builders.engines.checks import CheckResult
from builders.engines.serving import LockedRequirements, SourcePins
from builders.engines.vllm import devloop, lock
from builders.engines.vllm import preflight as vllm_preflight
from builders.engines.vllm.gpu_wheel import run_gpu_wheel_checks
from builders.engines.vllm.image_tests import run_checks
from builders.engines.vllm.plan import make_vllm_plan
from builders.engines.vllm.serve import VllmServer
from builders.engines.vllm.source_facts import read_pins
from builders.gates.context import PreflightContext
from builders.plan import BuildPlan, PlanOptions
from builders.rebuild.devtree import TreeManifest, TreeSplit
from builders.rebuild.records import ReuseRecord
from builders.target import Target


class Vllm(VllmServer):
    runtime_python: ClassVar[bool] = True

    def plan(self, distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
        return make_vllm_plan(distro, recipe, options)

    def preflight(self, ctx: PreflightContext) -> None:
        vllm_preflight.preflight(ctx)

    def checks(self, engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
        checks = run_checks(engine, image, plan)
        target = Target.resolve(plan.distro, plan.recipe)
        if target.cuda and target.from_wheelhouse:
            checks += run_gpu_wheel_checks(engine, image, plan)
        return checks

    def versions(self, checks: Sequence[CheckResult]) -> dict[str, str]:
        imported = next((c for c in checks if c.name == "import-vllm" and c.ok), None)
        if imported is None:
            return {}
        vllm_v, torch_v = ([*imported.detail.split(), "", ""])[:2]
        return {"vllm": vllm_v, "torch": torch_v}

    def stages_source(self, target: Target) -> bool:
        # A GPU build in wheel mode installs PyPI's CUDA wheel: no sdist to stage, nothing compiled.
        return target.compiles

    def source_pins(self, target: Target, source: Path) -> SourcePins:
        torch, version = read_pins(source, target.distro, target.device)
        return SourcePins(torch=torch, version=version)

    def split_tree(self, source: Path) -> TreeSplit | None:
        return devloop.split_source(source) if source.is_dir() else None

    def stage_tree(self, tree: TreeSplit, context_dir: Path) -> None:
        devloop.stage_tree(tree, context_dir)

    def reuse(
        self,
        tree: TreeSplit,
        *,
        log: str,
        plan: BuildPlan,
        base_image_id: str,
        cache_mounted: bool,
        previous: TreeManifest | None,
    ) -> ReuseRecord:
        return devloop.reuse_section(
            tree,
            log=log,
            compile_env=plan.compile_env,
            toolchain=devloop.toolchain_identity(base_image_id, plan.build_packages),
            cache_mounted=cache_mounted,
            previous=previous,
        )

    def locked_requirements(
        self,
        containers_dir: Path,
        target: Target,
        source: Path,
        *,
        torch_version: str | None,
        torch_index: TorchIndex | None,
    ) -> list[LockedRequirements]:
        return [
            *lock.filtered_requirements(containers_dir, source, target),
            lock.torch_requirements(source, target, torch_version, torch_index),
        ]
