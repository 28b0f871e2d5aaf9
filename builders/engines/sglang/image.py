"""SGLang's image plans: what both source-pinned ones share (labels, the sdist, the build settings), and which plan
a target gets — the CPU server compiled from source (cpu_image.py), the CUDA server from PyPI's wheel on NVIDIA's
base (gpu_image.py), or the CUDA server from a locked wheelhouse on a plain base (gpu_wheel.py)."""

from __future__ import annotations

from builders.config.models import Distro, Recipe
from builders.engines.sglang import cpu_image, gpu_image, gpu_wheel
from builders.engines.sglang.plan_inputs import PlanInputs
from builders.errors import ConfigError
from builders.plan import BuildPlan, ContextItem, PlanOptions
from builders.platforms import platform_of
from builders.target import Target

ENGINE = "sglang"


def plan(distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
    if Target.resolve(distro, recipe).from_wheelhouse:
        return gpu_wheel.plan(distro, recipe, options)
    assert recipe.source is not None and recipe.source.pypi is not None
    pin = recipe.source.pypi
    torch_version = options.torch_version or recipe.torch.version
    if torch_version is None:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: torch.version is null",
            hint="pin the torch release SGLang's pyproject names for this device",
        )
    labels = {
        "org.opencontainers.image.title": f"{recipe.name} on {distro.name}",
        "org.opencontainers.image.description": recipe.description,
        "org.opencontainers.image.version": pin.version,
        "org.opencontainers.image.vendor": "Forge",
        "org.opencontainers.image.source": f"https://pypi.org/project/{pin.name}/",
        "dev.forge.recipe": recipe.name,
        "dev.forge.distro": distro.name,
        "dev.forge.target": recipe.target,
        "dev.forge.platform": platform_of(distro).name,
        "dev.forge.engine": ENGINE,
    }
    sdist = ContextItem(
        name=f"sources/{pin.name}-{pin.version}.tar.gz",
        kind="sdist",
        origin=f"PyPI {pin.name}=={pin.version} sha256:{pin.sha256}",
    )
    common: dict[str, object] = {
        "distro": distro,
        "recipe": recipe,
        "target": recipe.target,
        "containerfile": "Containerfile",
        "template": recipe.template,
        "final_stage": "runtime",
        "max_jobs": options.max_jobs,
        "buildkit": options.buildkit,
        "trust_ca_bundle": options.trust_ca_bundle,
        "cmake_from_pip": False,
        "secrets": ("ca_bundle",) if options.trust_ca_bundle else (),
        "vllm_version": pin.version,
    }
    inputs = PlanInputs(
        distro=distro, recipe=recipe, options=options, torch_version=torch_version, labels=labels, common=common
    )
    if Target.resolve(distro, recipe).cuda:
        return gpu_image.plan(inputs)
    return cpu_image.plan(inputs, sdist=sdist)
