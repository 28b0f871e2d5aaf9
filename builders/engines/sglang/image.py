"""SGLang, rendered and preflighted: its CPU server on a distro's base, and its CUDA server beside vLLM's.

Forge does not serve SGLang anywhere, and nothing here pretends to: the CPU image needs sgl-kernel's CPU kernels,
which need AVX-512 and AMX, and no CPU here has them; the GPU image needs an NVIDIA GPU. The plans render real
Containerfiles, and preflight says what blocks them and where that requirement comes from.

Sources: PyPI's `sglang` sdist carries SGLang's Python package with pyproject_cpu.toml and its AMX probe; no PyPI
release of `sgl-kernel` (or `sglang-kernel`) has an sdist, so the kernels' CPU build source is a checkout of
sgl-project/sglang's sgl-kernel/ that the user passes (--source sgl-kernel=PATH), and the AVX-512 requirement it
states is pinned below as data with its citation.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from builders.config.models import Distro, Recipe
from builders.container import Engine
from builders.distros import family_for
from builders.engines.checks import CheckResult
from builders.engines.sdist import find_line, sdist_member
from builders.engines.serving import ServingEngine
from builders.errors import ConfigError
from builders.gates.context import PreflightContext
from builders.gates.findings import Finding, blocker, passed, unchecked, warning
from builders.plan import TORCH_INDEXES, BuildPlan, ContextItem, CudaPlan, PlanOptions, TorchSpec
from builders.platforms import platform_of
from builders.target import Target

# sgl-kernel's CPU build, read where it lives (not reachable from build hosts here, hence pinned as data):
SGL_KERNEL_CPU_CMAKE = (
    "sgl-project/sglang@047968281e791f8256bc68abf840e0e1d24c91e1 sgl-kernel/csrc/cpu/CMakeLists.txt:98 "
    '("These kernels still rely on x86-specific AMX/AVX512 implementations") and :127 (-march=native)'
)
# The AVX-512 subset PyTorch's CPU_CAPABILITY=AVX512 kernels (which sgl-kernel's vectorised code builds on) require:
# at::cpu::is_cpu_support_avx512() checks exactly these four (aten/src/ATen/cpu/Utils.cpp).
AVX512_FLAGS = ("avx512f", "avx512dq", "avx512bw", "avx512vl")
# SGLang's own probe, in the sdist: the intel_amx backend runs only where torch reports AMX tiles.
AMX_PROBE_FILE = "sglang/srt/utils/common.py"
AMX_PROBE = r"=\s*torch\._C\._cpu\._is_amx_tile_supported\(\)"
AMX_FLAGS = ("amx_tile",)
KERNEL_SOURCE = "sgl-kernel"


class SGLangRecipe(Recipe):
    """An SGLang recipe: the keys every recipe has, its engine named."""

    engine: Literal["sglang"] = Field(description="SGLang's server")


class SGLang(ServingEngine):
    name: ClassVar[str] = "sglang"
    title: ClassVar[str] = "SGLang"
    recipe_model: ClassVar[type[Recipe]] = SGLangRecipe

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
            # Never served by Forge: the test stage only runs the entrypoint's --help.
            "test_checks": (),
        }
        if Target.resolve(distro, recipe).cuda:
            return self._cuda_plan(distro, recipe, options, pin.version, torch_version, labels, common)
        # sgl-kernel's CMake compiles with -march=native: the build host's CPU decides, by SGLang's design.
        labels["dev.forge.isa"] = "sgl-kernel CPU: -march=native (its CMake's choice); needs AVX-512 and AMX"
        labels["org.opencontainers.image.base.name"] = distro.base.pinned_ref
        torch = TorchSpec(
            version=f"{torch_version}+cpu",
            index=recipe.torch.index,
            index_url=TORCH_INDEXES.get(recipe.torch.index),
            cuda_build_on_cpu=False,
        )
        context.append(
            ContextItem(
                name=f"sources/{KERNEL_SOURCE}",
                kind="source-dir",
                origin=f"a checkout of sgl-kernel/ ({SGL_KERNEL_CPU_CMAKE.split(' ', 1)[0]})",
            )
        )
        roles = ["c_compiler", "numa_headers", "python", "python_headers", "cmake", "build_tools"]
        compile_env = {k: v for k, v in family.compiler_env().items() if k != "PATH"}
        compile_env["MAX_JOBS"] = str(options.max_jobs)
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

    def gates(self, inputs: PreflightContext) -> list[Finding]:
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
        findings = [self._kernel_isa(inputs), self._amx(inputs)]
        findings.append(
            unchecked(
                "sgl-kernel-source",
                "not evaluated: no PyPI release of sgl-kernel carries its source (no sdist)",
                "a checkout of sgl-project/sglang's sgl-kernel/",
                SGL_KERNEL_CPU_CMAKE.split(" ", 1)[0],
                f"pass --source {KERNEL_SOURCE}=PATH to a checkout of sgl-kernel/ at that commit",
            )
        )
        return findings

    def _kernel_isa(self, inputs: PreflightContext) -> Finding:
        lacking = [f for f in AVX512_FLAGS if f not in inputs.run_flags]
        found = f"{inputs.run_source}: {'lacks ' + ', '.join(lacking) if lacking else 'has ' + ', '.join(AVX512_FLAGS)}"
        source = f"{SGL_KERNEL_CPU_CMAKE} (pinned as data: no sdist carries sgl-kernel's CPU build)"
        if not lacking:
            return passed("isa-avx512", found, ", ".join(AVX512_FLAGS), source)
        return blocker(
            "isa-avx512",
            found,
            ", ".join(AVX512_FLAGS),
            source,
            "build and run SGLang's CPU image on an AVX-512 CPU with AMX (Intel Xeon 4th generation or newer); "
            "on this CPU use the llama-cpp or vLLM cpu targets",
            "sgl-kernel's x86 CPU kernels are AVX-512/AMX code compiled with -march=native",
        )

    def _amx(self, inputs: PreflightContext) -> Finding:
        lacking = [f for f in AMX_FLAGS if f not in inputs.run_flags]
        if inputs.source is None:
            return unchecked(
                "isa-amx",
                f"not evaluated: {inputs.source_why}",
                "amx_tile",
                f"recipes/{inputs.recipe.name}.yaml: source.pypi",
                f"run `forge fetch {inputs.distro.name} {inputs.recipe.target}`, then preflight again",
            )
        text = sdist_member(inputs.source, AMX_PROBE_FILE)
        where = find_line(text, AMX_PROBE) if text is not None else None
        source = f"{inputs.source.name}: {AMX_PROBE_FILE}:{where[0]}" if where else f"{inputs.source.name}"
        found = f"{inputs.run_source}: {'lacks ' + ', '.join(lacking) if lacking else 'has amx_tile'}"
        if not lacking:
            return passed("isa-amx", found, "amx_tile", source)
        return warning(
            "isa-amx",
            found,
            "amx_tile",
            source,
            "run SGLang's CPU server on a CPU with AMX (Sapphire Rapids or newer)",
            "SGLang's intel_amx backend, the one sgl-kernel's CPU kernels serve, runs only where torch reports AMX "
            "tiles; elsewhere it falls back to torch_native",
        )

    def checks(self, engine: Engine, image: str, plan: BuildPlan) -> list[CheckResult]:
        # Forge does not build SGLang images here; a build elsewhere gets no serve check it could not pass here.
        return []
