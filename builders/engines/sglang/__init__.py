"""SGLang: what Forge knows about it, behind the one interface (`SGLang`, registered in builders/engines/__init__.py).

Its images are planned in image.py: the CPU server built from source (cpu_image.py, with sgl-kernel's CPU kernels
from the checkout kernel_source.py pins), the CUDA server from PyPI's wheel (gpu_image.py), and the CUDA server from
a sha256-locked wheelhouse on Debian (gpu_wheel.py, whose test stage is gpu_wheel_checks.py). The CPU image's
preflight gates, read from the sglang sdist and the kernels' checkout, are gates.py; its test stage checks.py; how a
pool serves it behind the router (its knobs, its command line, its argument checks) serve.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from builders.config.models import Distro, Recipe
from builders.container import Engine
from builders.engines.checks import CheckResult
from builders.engines.sglang import checks, gates, gpu_wheel, gpu_wheel_checks, image, kernel_source
from builders.engines.sglang.serve import SGLangServer
from builders.errors import SourceUnavailable
from builders.gates.context import PreflightContext
from builders.gates.findings import Finding, passed
from builders.plan import BuildPlan, PlanOptions
from builders.sources import ResolvedSource
from builders.target import Target


class SGLang(SGLangServer):
    runtime_python: ClassVar[bool] = True

    def plan(self, distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
        return image.plan(distro, recipe, options)

    def compiles(self, target: Target) -> bool:
        # sgl-kernel's CPU kernels are compiled here; the GPU images install PyPI's wheels.
        return target.cpu and target.native

    def gates(self, ctx: PreflightContext) -> list[Finding]:
        recipe = ctx.recipe
        if ctx.target.from_wheelhouse:
            return gpu_wheel.wheelhouse_findings(ctx)
        if ctx.target.cuda:
            return [
                passed(
                    "gpu-mode",
                    "wheel (PyPI's sglang wheel on the CUDA runtime base)",
                    "wheel",
                    f"recipes/{recipe.name}.yaml: cuda",
                    "nothing is compiled; Forge renders this image and does not build or serve it here",
                )
            ]
        return gates.preflight(ctx)

    def checkouts(self, target: Target, given: Mapping[str, Path]) -> list[ResolvedSource]:
        """The kernels' checkout for a CPU build (--source sgl-kernel=PATH); nothing for the GPU image, which
        compiles nothing. Raises SourceUnavailable naming the commit to check out."""
        if not target.cpu:
            return []
        recipe = target.recipe
        path = given.get(kernel_source.NAME)
        if path is None:
            pinned = recipe.source.pypi.version if recipe.source and recipe.source.pypi else "?"
            raise SourceUnavailable(
                f"recipes/{recipe.name}.yaml builds sgl-kernel's CPU kernels from source, and no PyPI release of "
                f"sgl-kernel or sglang-kernel carries it (wheels only): it comes from a checkout of "
                f"{kernel_source.PINNED} (sgl-kernel {kernel_source.VERSION}, which sglang {pinned} requires)",
                hint=kernel_source.checkout_hint(),
            )
        root = kernel_source.kernel_dir(path)
        return [ResolvedSource(name=kernel_source.NAME, path=root, origin=f"override: {root}")]

    def checks(self, engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
        if Target.resolve(plan.distro, plan.recipe).from_wheelhouse:
            return gpu_wheel_checks.run(engine, image, plan)
        if plan.cuda is not None:
            return []  # the GPU image on NVIDIA's base is rendered, never built here
        return checks.run(engine, image, plan)

    def versions(self, checks: Sequence[CheckResult]) -> dict[str, str]:
        imported = next((c for c in checks if c.name == "import-sglang" and c.ok), None)
        if imported is None:
            return {}
        sglang_v, torch_v = ([*imported.detail.split(), "", ""])[:2]
        return {"sglang": sglang_v, "torch": torch_v}
