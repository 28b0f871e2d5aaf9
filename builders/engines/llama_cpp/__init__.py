"""llama.cpp: what Forge knows about it, behind the one interface (`LlamaCpp`, registered in
builders/engines/__init__.py). Its image is compiled from the llama.cpp tree PyPI's llama-cpp-python sdist vendors:
the plan is image.py, the preflight gates read from its own CMake gates.py, the test stage checks.py, the facts of
its source tree tree.py; the tiny GGUF model its checks and pools serve is gguf_model.py, and how a pool serves it
serve.py."""

from __future__ import annotations

from builders.config.models import Distro, Recipe
from builders.container import Engine
from builders.engines.checks import CheckResult
from builders.engines.llama_cpp import checks, gates, image
from builders.engines.llama_cpp.serve import LlamaCppServer
from builders.gates.context import PreflightContext
from builders.gates.findings import Finding
from builders.plan import BuildPlan, PlanOptions
from builders.target import Target


class LlamaCpp(LlamaCppServer):
    def plan(self, distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
        return image.plan(distro, recipe, options)

    def compiles(self, target: Target) -> bool:
        return True  # llama-server is always compiled from the pinned tree

    def gates(self, ctx: PreflightContext) -> list[Finding]:
        return gates.preflight(ctx)

    def checks(self, engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
        return checks.run(engine, image, plan)
