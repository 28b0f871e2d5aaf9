"""SGLang's CPU image, built from source: sgl-kernel's CPU kernels (AVX-512 BF16 and AMX code, compiled with
-march=native by their own CMake) against the torch SGLang pins for CPU, SGLang's Python package from its PyPI sdist
beside them, and a test stage that serves a tiny random model (checks.py). The kernels' source is a checkout the
user passes (kernel_source.py says why and which commit); without it the build stops before anything is compiled,
naming the commit and `--source sgl-kernel=PATH`."""

from __future__ import annotations

from builders.distros import family_for
from builders.engines.sglang import checks, kernel_source
from builders.engines.sglang.plan_inputs import PlanInputs
from builders.errors import UsageError
from builders.plan import TORCH_INDEXES, BuildPlan, ContextItem, TorchSpec

# Where the CPU build installs torch's CUDA stub CMake (containers/scripts/), for PyPI's torch, which is a CUDA build.
CUDART_STUB = "-DCMAKE_PROJECT_INCLUDE=/opt/forge/scripts/torch_cudart_stub.cmake"


def plan(inputs: PlanInputs, *, sdist: ContextItem) -> BuildPlan:
    distro, recipe, options = inputs.distro, inputs.recipe, inputs.options
    assert recipe.source is not None and recipe.source.pypi is not None
    pin = recipe.source.pypi
    family = family_for(distro)
    index = options.torch_index or recipe.torch.index
    if index not in ("pytorch-cpu", "pypi"):
        raise UsageError(
            f"torch index {index!r} for recipes/{recipe.name}.yaml: its CPU build takes torch from PyTorch's CPU "
            "index or from PyPI",
            hint="pass --torch-index pytorch-cpu or --torch-index pypi",
        )
    # PyPI's torch for Linux x86_64 is its CUDA build; PyTorch's CPU index names the same release +cpu.
    version = inputs.torch_version.split("+", 1)[0] + ("+cpu" if index == "pytorch-cpu" else "")
    url = recipe.torch.index_url if index == recipe.torch.index and recipe.torch.index_url else None
    torch = TorchSpec(
        version=version,
        index=index,
        index_url=url or TORCH_INDEXES.get(index),
        cuda_build_on_cpu=index == "pypi",
    )
    labels = inputs.labels | {
        "org.opencontainers.image.base.name": distro.base.pinned_ref,
        # sgl-kernel's CMake compiles with -march=native: the build host's CPU decides, by SGLang's design.
        "dev.forge.isa": "sgl-kernel CPU: -march=native (its CMake's choice); needs AVX-512 BF16 and AMX",
        "dev.forge.sgl-kernel": f"{kernel_source.VERSION} ({kernel_source.PINNED}, sgl-kernel/)",
        "dev.forge.torch": torch.requirement + (" (PyPI's CUDA build)" if torch.cuda_build_on_cpu else ""),
    }
    kernels = ContextItem(
        name=f"sources/{kernel_source.NAME}",
        kind="source-dir",
        origin=f"a checkout of sgl-kernel/ ({kernel_source.PINNED})",
    )
    roles = ["c_compiler", "numa_headers", "python", "python_headers", "cmake", "build_tools"]
    compile_env = {k: v for k, v in family.compiler_env().items() if k != "PATH"}
    compile_env["MAX_JOBS"] = str(options.max_jobs)
    # scikit-build-core runs CMake's build, which reads its job count here (ninja would take every core).
    compile_env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(options.max_jobs)
    if torch.cuda_build_on_cpu:
        # scikit-build-core passes CMAKE_ARGS to CMake: torch's CMake config then links a torch::cudart that
        # exists, which a host without the CUDA toolkit cannot otherwise provide.
        compile_env["CMAKE_ARGS"] = CUDART_STUB
    return BuildPlan(
        **inputs.common,  # type: ignore[arg-type]
        base_ref=distro.base.local_tag,
        image_tag=options.tag or f"forge/{distro.name}-{recipe.target}:{pin.version}",
        torch=torch,
        compile_env=compile_env,
        build_args={"BASE_IMAGE": distro.base.local_tag},
        context=(sdist, kernels),
        labels=labels,
        runtime_packages=tuple(family.packages(["runtime"])),
        build_packages=tuple(family.packages(roles)),  # type: ignore[arg-type]
        test_checks=checks.CPU_CHECKS if recipe.serve_test else ("kernel-ops",),
    )
