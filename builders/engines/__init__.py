"""The serving engines, one package each (builders/engines/<name>/), and the one registry of them.

Each package holds what Forge knows about its engine behind one interface (`ServingEngine`, serving.py): how its
image is planned, the gates its preflight runs, the checks run in the image just built, the recipe and pool
settings models that hold its own keys, the options smoke and sweep take for it, and how a pool serves it.
`ENGINES` below is the registry, one line per engine: every list of engine names is derived from it, and the core
(plan, preflight, build, lock, smoke, sweep, deploy) imports it and asks the engine a recipe or pool names.
"""

from __future__ import annotations

from builders.config.models import Distro, GpuMode, Recipe
from builders.engines.llama_cpp import LlamaCpp
from builders.engines.registry import Registry
from builders.engines.serving import ModelFormat, PoolCommand, ServerProbe, ServingEngine
from builders.engines.sglang import SGLang
from builders.engines.vllm import Vllm
from builders.errors import UsageError
from builders.plan import BuildPlan, CudaPlan, PlanOptions
from builders.target import Target

ENGINES = Registry(Vllm(), LlamaCpp(), SGLang())
"""Every serving engine, the default (what a recipe or pool naming none gets) first."""


def make_plan(distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
    """The plan of one distro × recipe, made by the recipe's engine (the router's image rides vLLM's CPU plan)."""
    if not recipe.supports(distro.name):
        # A usage error, not a traceback: `forge plan debian-13 gpu` says which distros the recipe takes.
        supported = ", ".join(recipe.distros) if recipe.distros != "all" else "all"
        raise UsageError(
            f"recipes/{recipe.name}.yaml does not support {distro.name}",
            hint=f"its distros: {supported} (`forge list` shows every distro × target)",
        )
    return ENGINES.of(recipe).plan(distro, recipe, options)


def cuda_plan(distro: Distro, recipe: Recipe, gpu_mode: GpuMode | None) -> CudaPlan | None:
    """The CUDA part of the plan a build would make (mode, bases); None for a CPU image or a distro without a
    cuda section."""
    if not Target.resolve(distro, recipe).cuda or distro.cuda is None:
        return None
    # Only the mode and the bases are read from this plan; the torch gate judges torch from the real pin.
    options = PlanOptions(max_jobs=1, gpu_mode=gpu_mode, torch_version=recipe.torch.version or "0")
    return make_plan(distro, recipe, options).cuda


def serving_engine(name: str) -> ServingEngine:
    """The engine a pool names (validated when its profile loaded)."""
    return ENGINES.get(name)


__all__ = [
    "ENGINES",
    "ModelFormat",
    "PoolCommand",
    "ServerProbe",
    "ServingEngine",
    "cuda_plan",
    "make_plan",
    "serving_engine",
]
