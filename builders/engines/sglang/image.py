"""SGLang's images: its CPU server built from source on a distro's base, and its CUDA server beside vLLM's.

The CPU image compiles sgl-kernel's CPU kernels (AVX-512 BF16 and AMX code, built with -march=native by their own
CMake) against the torch SGLang pins for CPU, installs SGLang's Python package from its PyPI sdist beside them,
and serves a tiny random model in its test stage. The kernels' source is a checkout the user passes
(kernel_source.py says why and which commit); without it the build stops before anything is compiled, naming the
commit and `--source sgl-kernel=PATH`. The GPU image installs PyPI's sglang wheel on the CUDA runtime base and is
rendered and preflighted only: no GPU here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builders.config.models import Distro, Recipe
from builders.container import Engine
from builders.distros import family_for
from builders.engines.checks import CheckResult
from builders.engines.sglang import checks as sglang_checks
from builders.engines.sglang import gates as sglang_gates
from builders.engines.sglang import kernel_source
from builders.errors import ConfigError, SourceUnavailable, UsageError
from builders.plan import TORCH_INDEXES, BuildPlan, ContextItem, CudaPlan, PlanOptions, TorchSpec
from builders.platforms import platform_of
from builders.preflight.findings import Finding, passed
from builders.preflight.inputs import PreflightInputs
from builders.sources import ResolvedSource
from builders.target import Target

# Where the CPU build installs torch's CUDA stub CMake (containers/scripts/), for PyPI's torch, which is a CUDA build.
CUDART_STUB = "-DCMAKE_PROJECT_INCLUDE=/opt/forge/scripts/torch_cudart_stub.cmake"


@dataclass(frozen=True, kw_only=True)
class SGLang:
    name: str = "sglang"

    def plan(self, distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
        assert recipe.source is not None and recipe.source.pypi is not None
        pin = recipe.source.pypi
        family = family_for(distro)
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
            "dev.forge.engine": self.name,
        }
        context = [
            ContextItem(
                name=f"sources/{pin.name}-{pin.version}.tar.gz",
                kind="sdist",
                origin=f"PyPI {pin.name}=={pin.version} sha256:{pin.sha256}",
            )
        ]
        common = {
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
        if Target.resolve(distro, recipe).cuda:
            # Never served by Forge: no GPU here.
            return self._cuda_plan(distro, recipe, options, pin.version, torch_version, labels, common)
        index = options.torch_index or recipe.torch.index
        if index not in ("pytorch-cpu", "pypi"):
            raise UsageError(
                f"torch index {index!r} for recipes/{recipe.name}.yaml: its CPU build takes torch from PyTorch's CPU "
                "index or from PyPI",
                hint="pass --torch-index pytorch-cpu or --torch-index pypi",
            )
        # PyPI's torch for Linux x86_64 is its CUDA build; PyTorch's CPU index names the same release +cpu.
        version = torch_version.split("+", 1)[0] + ("+cpu" if index == "pytorch-cpu" else "")
        url = recipe.torch.index_url if index == recipe.torch.index and recipe.torch.index_url else None
        torch = TorchSpec(
            version=version,
            index=index,
            index_url=url or TORCH_INDEXES.get(index),
            cuda_build_on_cpu=index == "pypi",
        )
        labels |= {
            "org.opencontainers.image.base.name": distro.base.pinned_ref,
            # sgl-kernel's CMake compiles with -march=native: the build host's CPU decides, by SGLang's design.
            "dev.forge.isa": "sgl-kernel CPU: -march=native (its CMake's choice); needs AVX-512 BF16 and AMX",
            "dev.forge.sgl-kernel": f"{kernel_source.VERSION} ({kernel_source.PINNED}, sgl-kernel/)",
            "dev.forge.torch": torch.requirement + (" (PyPI's CUDA build)" if torch.cuda_build_on_cpu else ""),
        }
        context.append(
            ContextItem(
                name=f"sources/{kernel_source.NAME}",
                kind="source-dir",
                origin=f"a checkout of sgl-kernel/ ({kernel_source.PINNED})",
            )
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
            **common,  # type: ignore[arg-type]
            base_ref=distro.base.local_tag,
            image_tag=options.tag or f"forge/{distro.name}-{recipe.target}:{pin.version}",
            torch=torch,
            compile_env=compile_env,
            build_args={"BASE_IMAGE": distro.base.local_tag},
            context=tuple(context),
            labels=labels,
            runtime_packages=tuple(family.packages(["runtime"])),
            build_packages=tuple(family.packages(roles)),  # type: ignore[arg-type]
            test_checks=sglang_checks.CPU_CHECKS if recipe.serve_test else ("kernel-ops",),
        )

    def _cuda_plan(
        self,
        distro: Distro,
        recipe: Recipe,
        options: PlanOptions,
        version: str,
        torch_version: str,
        labels: dict[str, str],
        common: dict[str, object],
    ) -> BuildPlan:
        if distro.cuda is None or recipe.cuda is None:
            raise ConfigError(
                f"distros/{distro.name}.yaml has no cuda section, so recipes/{recipe.name}.yaml cannot target it",
                hint="list only distros with a cuda section in the recipe's distros",
            )
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
        labels |= {
            "org.opencontainers.image.base.name": runtime_ref,
            "dev.forge.cuda.version": cuda.version,
            "dev.forge.wheel": f"{wheel.filename} sha256:{wheel.sha256}",
        }
        torch = TorchSpec(
            version=f"{torch_version}+{cuda.torch_tag}",
            index="pytorch-cuda",
            index_url=f"https://download.pytorch.org/whl/{cuda.torch_tag}",
            cuda_build_on_cpu=False,
        )
        return BuildPlan(
            **common,  # type: ignore[arg-type]
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

    def source_version(self, source: Path) -> str | None:
        return None

    def sources(self, target: Target, overrides: dict[str, Path]) -> list[ResolvedSource]:
        """The kernels' checkout for a CPU build (--source sgl-kernel=PATH); nothing for the GPU image, which
        compiles nothing. Raises SourceUnavailable naming the commit to check out."""
        if not target.cpu:
            return []
        recipe = target.recipe
        path = overrides.get(kernel_source.NAME)
        if path is None:
            raise SourceUnavailable(
                f"recipes/{recipe.name}.yaml builds sgl-kernel's CPU kernels from source, and no PyPI release of "
                f"sgl-kernel or sglang-kernel carries it (wheels only): it comes from a checkout of "
                f"{kernel_source.PINNED} (sgl-kernel {kernel_source.VERSION}, which sglang "
                f"{recipe.source.pypi.version if recipe.source and recipe.source.pypi else '?'} requires)",
                hint=kernel_source.checkout_hint(),
            )
        root = kernel_source.kernel_dir(path)
        return [ResolvedSource(name=kernel_source.NAME, path=root, origin=f"override: {root}")]

    def preflight(self, inputs: PreflightInputs) -> list[Finding]:
        recipe = inputs.recipe
        if Target.resolve(inputs.distro, recipe).cuda:
            return [
                passed(
                    "gpu-mode",
                    "wheel (PyPI's sglang wheel on the CUDA runtime base)",
                    "wheel",
                    f"recipes/{recipe.name}.yaml: cuda",
                    "nothing is compiled; Forge renders this image and does not build or serve it here",
                )
            ]
        return sglang_gates.preflight(inputs)

    def checks(self, engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
        if plan.cuda is not None:
            return []  # the GPU image is rendered, never built here
        return sglang_checks.run(engine, image, plan)


ENGINE = SGLang()
