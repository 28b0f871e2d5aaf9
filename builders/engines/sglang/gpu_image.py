"""SGLang's CUDA image: PyPI's sglang wheel on the CUDA runtime base, beside vLLM's. Nothing is compiled; Forge
renders and preflights it, and a GPU host builds it."""

from __future__ import annotations

from builders.distros import family_for
from builders.engines.sglang.plan_inputs import PlanInputs
from builders.errors import ConfigError
from builders.plan import BuildPlan, CudaPlan, TorchSpec


def plan(inputs: PlanInputs) -> BuildPlan:
    distro, recipe, options = inputs.distro, inputs.recipe, inputs.options
    if distro.cuda is None or recipe.cuda is None:
        raise ConfigError(
            f"distros/{distro.name}.yaml has no cuda section, so recipes/{recipe.name}.yaml cannot target it",
            hint="list only distros with a cuda section in the recipe's distros",
        )
    assert recipe.source is not None and recipe.source.pypi is not None
    version = recipe.source.pypi.version
    cuda, gpu = distro.cuda, recipe.cuda
    wheel = next((w for w in gpu.wheels if w.arch == distro.arch), None)
    if wheel is None:
        raise ConfigError(f"recipes/{recipe.name}.yaml: cuda.wheels has no {distro.arch} wheel")
    runtime_ref = cuda.runtime_image if not cuda.runtime_digest else f"{cuda.runtime_image}@{cuda.runtime_digest}"
    if cuda.runtime_image == distro.base.image:
        runtime_ref = distro.base.local_tag
    family = family_for(distro)
    runtime_packages = tuple(family.packages(["runtime"]))
    runtime_packages += tuple(p for p in cuda.runtime_packages if p not in runtime_packages)
    labels = inputs.labels | {
        "org.opencontainers.image.base.name": runtime_ref,
        "dev.forge.cuda.version": cuda.version,
        "dev.forge.wheel": f"{wheel.filename} sha256:{wheel.sha256}",
    }
    torch = TorchSpec(
        version=f"{inputs.torch_version}+{cuda.torch_tag}",
        index="pytorch-cuda",
        index_url=f"https://download.pytorch.org/whl/{cuda.torch_tag}",
        cuda_build_on_cpu=False,
    )
    return BuildPlan(
        **inputs.common,  # type: ignore[arg-type]
        base_ref=runtime_ref,
        image_tag=options.tag or f"forge/{distro.name}-{recipe.target}:{version}",
        torch=torch,
        compile_env={},
        build_args={"RUNTIME_IMAGE": runtime_ref},
        context=(),
        labels=labels,
        runtime_packages=runtime_packages,
        build_packages=(),
        cuda=CudaPlan(
            mode="wheel",
            version=cuda.version,
            devel_ref=None,
            runtime_ref=runtime_ref,
            home=cuda.home,
            torch_tag=cuda.torch_tag,
            arch_list=gpu.arch_list,
            nvcc_threads=gpu.nvcc_threads,
            host_cxx=None,
            toolkit_install=None,
            wheel_requirement=f"{gpu.wheel_project}=={gpu.wheel_version}",
            wheel=wheel,
            build_python_packages=tuple(p for p in family.packages(["python"]) if p not in runtime_packages),
        ),
    )
