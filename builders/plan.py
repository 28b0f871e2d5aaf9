"""distro + recipe + options → BuildPlan. Pure: no engine, no network, no filesystem writes.

The executor (builders/build.py) stages what the plan names and runs it; tests check plans in milliseconds.
"""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Literal, Protocol

from builders.config.models import Distro, GpuMode, Recipe, TorchIndex, WheelFile
from builders.distros import family_for
from builders.errors import ConfigError, UsageError
from builders.platforms import isa_for, platform_of
from builders.target import Target, engine_module

TORCH_INDEXES = {
    "pytorch-cpu": "https://download.pytorch.org/whl/cpu",
    "pytorch-cuda": "https://download.pytorch.org/whl/cu130",
    "pypi": "https://pypi.org/simple",
}

# Where the build stages its work inside the container: /tmp may be a small tmpfs on some hosts and bases.
BUILD_DIR = "/var/tmp/forge"

PYTORCH_WHEEL_ROOT = "https://download.pytorch.org/whl"


@dataclass(frozen=True, kw_only=True)
class TorchSpec:
    version: str
    index: str
    index_url: str | None
    # PyPI's torch for Linux x86_64 is the CUDA build: usable for a CPU build only with a torch::cudart stub,
    # and the runtime must then carry the same torch because vLLM's _C links libtorch_cuda.so.
    cuda_build_on_cpu: bool

    @property
    def requirement(self) -> str:
        return f"torch=={self.version}"


@dataclass(frozen=True, kw_only=True)
class ContextItem:
    """Something the executor puts into the build context before building."""

    name: str  # path inside the context
    kind: Literal["sdist", "source-dir", "wheelhouse", "package", "script"]
    origin: str  # human-readable: where it comes from


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """What the planner is told; builders/options.plan_options derives it from BuildOptions."""

    max_jobs: int
    buildkit: bool = True
    trust_ca_bundle: bool = False  # a CA bundle was found: the build stages trust it (never the runtime)
    torch_version: str | None = None
    torch_index: TorchIndex | None = None
    cmake_from_pip: bool | None = None
    vllm_version: str | None = None
    base_digest: str | None = None
    source_date_epoch: int | None = None
    tag: str | None = None
    gpu_mode: GpuMode | None = None  # device=cuda recipes: overrides recipes' cuda.mode
    cuda_arch_list: str | None = None  # device=cuda recipes: overrides recipes' cuda.arch_list


@dataclass(frozen=True, kw_only=True)
class CudaPlan:
    """What a GPU plan adds: the CUDA bases, how vLLM gets in, and what a compile targets."""

    mode: GpuMode
    version: str  # CUDA major.minor of the bases
    devel_ref: str | None  # build base; None in wheel mode, which compiles nothing
    runtime_ref: str
    home: str  # CUDA_HOME in the build stage
    torch_tag: str  # cu130
    arch_list: str
    nvcc_threads: int
    host_cxx: str | None  # CUDAHOSTCXX, when the build uses another compiler than the distro's g++
    toolkit_install: str | None  # shell enabling NVIDIA's repository and installing nvcc, for bases without it
    header_fix: str | None = None  # shell adapting the toolkit's headers to the distro's glibc
    wheel_requirement: str  # vllm==0.33.0: the official wheel (wheel mode)
    wheel: WheelFile | None  # that wheel's file for the distro's arch, pinned by sha256
    build_python_packages: tuple[str, ...]  # what the venv stage adds to the runtime base to make a venv


@dataclass(frozen=True, kw_only=True)
class BuildPlan:
    distro: Distro
    recipe: Recipe
    target: str
    base_ref: str
    image_tag: str
    containerfile: str  # file name in the context
    template: str
    final_stage: str
    max_jobs: int
    buildkit: bool
    trust_ca_bundle: bool
    cmake_from_pip: bool
    torch: TorchSpec | None
    compile_env: dict[str, str]
    build_args: dict[str, str]
    context: tuple[ContextItem, ...]
    labels: dict[str, str]
    secrets: tuple[str, ...]
    runtime_packages: tuple[str, ...]
    build_packages: tuple[str, ...]
    vllm_version: str | None
    test_checks: tuple[str, ...] = field(default=())
    cuda: CudaPlan | None = None
    # kind=native: the -D options of the engine's CMake configure, apart from the ISA build args
    cmake_defines: dict[str, str] = field(default_factory=dict)

    @property
    def session_id(self) -> str:
        return f"{self.distro.name}-{self.target}"

    @property
    def platform(self) -> str:
        """linux/amd64 or linux/arm64: what the builder is asked for and the OCI index records."""
        return platform_of(self.distro).name


def torch_spec(target: Target, options: PlanOptions) -> TorchSpec | None:
    if not target.runs_vllm:
        return None
    recipe = target.recipe
    index = options.torch_index or recipe.torch.index
    version = options.torch_version or recipe.torch.version
    if version is None:
        raise UsageError(
            f"recipes/{recipe.name}.yaml: torch.version is null (vLLM's pin) and no pin was read from the source",
            hint="pass --torch-version, or `forge fetch` the vLLM source so its pin can be read",
        )
    if index != "pytorch-cpu" and index != "pytorch-cuda":
        version = version.split("+", 1)[0]  # local version labels exist only on PyTorch's own indexes
    elif index == "pytorch-cpu" and "+" not in version:
        version = f"{version}+cpu"
    url = recipe.torch.index_url if recipe.torch.index == index and recipe.torch.index_url else TORCH_INDEXES.get(index)
    return TorchSpec(
        version=version,
        index=index,
        index_url=url,
        cuda_build_on_cpu=target.cpu and index == "pypi",
    )


class NativePlanner(Protocol):
    def plan(self, distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan: ...


def native_module(recipe: Recipe) -> ModuleType:
    """The engine module of a kind=native recipe. A plugin boundary: engine modules (builders/inference) import this
    module, never the reverse, so it is loaded by the name the recipe's engine gives it."""
    target_module = engine_module(recipe)
    try:
        return importlib.import_module(target_module)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: engine {recipe.engine!r} with kind native has no module {target_module}",
            hint="kind: native is for engines with a module in builders/inference; vLLM recipes use source or wheel",
        ) from exc


def native_planner(target: Target) -> NativePlanner:
    planner: NativePlanner = native_module(target.recipe).ENGINE
    return planner


def image_labels(
    distro: Distro, recipe: Recipe, *, version: str, base_name: str, base_digest: str, with_source: bool = True
) -> dict[str, str]:
    """The OCI and Forge labels every image carries, whichever engine or planner made the plan: a registry
    or `inspect` reader finds the recipe, distro, base and source the same way on each."""
    labels = {
        "org.opencontainers.image.title": f"{recipe.name} on {distro.name}",
        "org.opencontainers.image.description": recipe.description,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.base.name": base_name,
        "org.opencontainers.image.base.digest": base_digest,
        "org.opencontainers.image.vendor": "Forge",
        "dev.forge.recipe": recipe.name,
        "dev.forge.distro": distro.name,
        "dev.forge.target": recipe.target,
    }
    if with_source and recipe.source and recipe.source.pypi:
        labels["dev.forge.source.sha256"] = recipe.source.pypi.sha256
        labels["org.opencontainers.image.source"] = f"https://pypi.org/project/{recipe.source.pypi.name}/"
    return labels


def image_build_args(base: dict[str, str], options: PlanOptions) -> dict[str, str]:
    """The build args a plan names, plus the ones every build takes from its options."""
    args = dict(base)
    if options.source_date_epoch is not None:
        args["SOURCE_DATE_EPOCH"] = str(options.source_date_epoch)
    return args


def make_plan(distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
    if not recipe.supports(distro.name):
        # A usage error, not a traceback: `forge plan debian-13 gpu` says which distros the recipe takes.
        supported = ", ".join(recipe.distros) if recipe.distros != "all" else "all"
        raise UsageError(
            f"recipes/{recipe.name}.yaml does not support {distro.name}",
            hint=f"its distros: {supported} (`forge list` shows every distro × target)",
        )
    target = Target.resolve(distro, recipe, gpu_mode=options.gpu_mode)
    if target.native:
        return native_planner(target).plan(distro, recipe, options)
    if target.cuda and target.from_wheelhouse:
        # CUDA from PyPI's wheels on a plain distro base: no NVIDIA image. Loaded by name, as native_module loads
        # an engine's planner: builders/gpu_wheel.py imports this module, never the reverse.
        planner: Callable[[Distro, Recipe, PlanOptions], BuildPlan] = importlib.import_module(
            "builders.gpu_wheel"
        ).make_gpu_wheel_plan
        return planner(distro, recipe, options)
    if target.cuda:
        return make_cuda_plan(distro, recipe, options)
    family = family_for(distro)
    torch = torch_spec(target, options)
    cmake_from_pip = recipe.cmake_from_pip if options.cmake_from_pip is None else options.cmake_from_pip

    base_ref = distro.base.local_tag
    vllm_version = options.vllm_version
    if recipe.source and recipe.source.pypi:
        vllm_version = vllm_version or recipe.source.pypi.version
    if recipe.wheelhouse:
        pins = [r.split("==", 1)[1] for r in recipe.wheelhouse.requirements if r.startswith("vllm") and "==" in r]
        vllm_version = vllm_version or (pins[0] if pins else None)
    suffix = platform_of(distro).suffix
    tag = options.tag or f"forge/{distro.name}-{recipe.target}{suffix}:{vllm_version or 'latest'}"

    context: list[ContextItem] = [ContextItem(name="scripts", kind="script", origin="containers/scripts")]
    build_roles: list[str] = []
    compile_env: dict[str, str] = {}
    if target.compiles:
        assert recipe.source is not None
        if recipe.source.pypi:
            sdist = f"{recipe.source.pypi.name}-{recipe.source.pypi.version}.tar.gz"
            context.append(
                ContextItem(
                    name=f"sources/{sdist}",
                    kind="sdist",
                    origin=f"PyPI {recipe.source.pypi.name}=={recipe.source.pypi.version} "
                    f"sha256:{recipe.source.pypi.sha256}",
                )
            )
        else:
            assert recipe.source.git is not None
            context.append(
                ContextItem(
                    name="sources/vllm", kind="source-dir", origin=f"{recipe.source.git.url}@{recipe.source.git.ref}"
                )
            )
        for fetched in recipe.fetched_sources:
            context.append(
                ContextItem(
                    name=f"sources/{fetched.name}",
                    kind="source-dir",
                    origin=f"{fetched.name} (pinned in {fetched.pinned_in})",
                )
            )
            compile_env[fetched.cmake_var] = f"/opt/src/{fetched.name}"
        build_roles = ["c_compiler", "numa_headers", "tcmalloc", "python", "python_headers", "build_tools"]
        if "ccache" in distro.packages:
            build_roles.append("ccache")
        if not cmake_from_pip:
            build_roles.append("cmake")
        compile_env.update(recipe.build_env)
        compile_env.update(isa_for(recipe.isa, distro.arch))
        compile_env["MAX_JOBS"] = str(options.max_jobs)
        compile_env.update({k: v for k, v in family.compiler_env().items() if k != "PATH"})
        if torch and torch.cuda_build_on_cpu:
            compile_env["CMAKE_ARGS"] = "-DCMAKE_PROJECT_INCLUDE=/opt/forge/scripts/torch_cudart_stub.cmake"
    if (torch and torch.index == "wheelhouse") or target.from_wheelhouse:
        context.append(ContextItem(name="wheelhouse", kind="wheelhouse", origin="local wheels (--wheelhouse)"))
    if target.python_app:
        context.append(ContextItem(name="app", kind="package", origin="this checkout's builders/ package"))
        # The router's C relay is compiled in the image's venv stage (containers/router.Containerfile.j2).
        build_roles = ["python", "c_compiler", "python_headers"]
        compile_env.update({k: v for k, v in family.compiler_env().items() if k != "PATH"})

    build_packages = tuple(family.packages(build_roles))  # type: ignore[arg-type]
    if target.compiles:
        for fetched in recipe.fetched_sources:
            missing = [role for role in fetched.build_roles if role not in distro.packages]
            if missing:
                raise ConfigError(
                    f"distros/{distro.name}.yaml: packages.{missing[0]} is missing, and recipes/{recipe.name}.yaml "
                    f"fetched_sources.{fetched.name}.build_roles needs it",
                    hint=f"name the package that provides {missing[0]} on {distro.name}",
                )
        extra = family.packages(role for f in recipe.fetched_sources for role in f.build_roles)
        build_packages += tuple(p for p in extra if p not in build_packages)

    labels = image_labels(
        distro,
        recipe,
        version=vllm_version or "",
        base_name=distro.base.pinned_ref,
        base_digest=options.base_digest or distro.base.digest or "unpinned",
    )
    labels["dev.forge.platform"] = platform_of(distro).name
    if torch:
        labels["dev.forge.torch"] = f"{torch.requirement} from {torch.index}"

    build_args = image_build_args({"BASE_IMAGE": base_ref}, options)

    checks: tuple[str, ...] = ()
    if target.runs_vllm:
        checks = ("import-vllm", "vllm-version", "cpu-kernels", "tcmalloc-mapped")
        checks += ("serve-models",) if recipe.serve_test else ()
    elif recipe.target == "router":
        # The image builds the router's C relay; a router that fell back to Python would cost more CPU unnoticed.
        checks = ("entrypoint-help", "router-relay")
    else:
        checks = ("entrypoint-help",)

    return BuildPlan(
        distro=distro,
        recipe=recipe,
        target=recipe.target,
        base_ref=base_ref,
        image_tag=tag,
        containerfile="Containerfile",
        template=recipe.template,
        final_stage="runtime",
        max_jobs=options.max_jobs,
        buildkit=options.buildkit,
        trust_ca_bundle=options.trust_ca_bundle,
        cmake_from_pip=cmake_from_pip,
        torch=torch,
        compile_env=compile_env,
        build_args=build_args,
        context=tuple(context),
        labels=labels,
        secrets=("ca_bundle",) if options.trust_ca_bundle else (),
        runtime_packages=tuple(
            family.packages(["runtime", "c_compiler", "python_headers"] if recipe.runtime_jit_compiler else ["runtime"])
        ),
        build_packages=build_packages,
        vllm_version=vllm_version,
        test_checks=checks,
    )


# --- GPU (CUDA) ---------------------------------------------------------------------------------------------


def _cuda_ref(distro: Distro, image: str, digest: str | None) -> str:
    # A CUDA base that is the distro's own base (Fedora: no NVIDIA image) is the one `forge bootstrap` makes.
    if image == distro.base.image:
        return distro.base.local_tag
    return f"{image}@{digest}" if digest else image


def cuda_torch(target: Target, options: PlanOptions, torch_tag: str) -> TorchSpec:
    """torch for a CUDA image: on PyTorch's CUDA index, the build for the base's CUDA (torch==2.14.0+cu130)."""
    recipe = target.recipe
    spec = torch_spec(target, options)
    assert spec is not None  # device=cuda is never device=none
    if spec.index != "pytorch-cuda":
        return spec
    own_url = recipe.torch.index_url if recipe.torch.index == "pytorch-cuda" else None
    return replace(
        spec,
        version=f"{spec.version.split('+', 1)[0]}+{torch_tag}",
        index_url=own_url or f"{PYTORCH_WHEEL_ROOT}/{torch_tag}",
    )


def glibc_rsqrt_fix(cuda_home: str) -> str:
    """Shell giving CUDA's rsqrt/rsqrtf declarations glibc's exception specification where glibc declares them
    (2.42+, C23 functions on), the way NVIDIA's header already treats sinpi and cospi. Applied once; it fails the
    build if the header does not hold the two declarations it expects (a CUDA release that changed them)."""
    header = f"{cuda_home}/include/crt/math_functions.h"
    decl = r"^(extern __DEVICE_FUNCTIONS_DECL__ __device_builtin__ (double|float) +rsqrtf?\((double|float) x\))"
    guarded = (
        r"#if defined(__cplusplus) \&\& defined(__GLIBC__) \&\& defined(__GLIBC_PREREQ)\n"
        r"#if __GLIBC_PREREQ(2, 42) \&\& __GLIBC_USE(IEC_60559_FUNCS_EXT_C23)\n"
        r"#define __FORGE_GLIBC_RSQRT 1\n#endif\n#endif\n"
        r"#ifdef __FORGE_GLIBC_RSQRT\n\1 __THROW;\n#else\n\1;\n#endif"
    )
    return (
        f"grep -q __FORGE_GLIBC_RSQRT {header} || {{ test \"$(grep -cE '{decl};$' {header})\" = 2 "
        f"&& sed -Ei 's/{decl};$/{guarded}/' {header} "
        f"&& test \"$(grep -cE '{decl} __THROW;$' {header})\" = 2; }}"
    )


def make_cuda_plan(distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
    """The GPU branch of make_plan: a CUDA devel base builds (source mode), a CUDA runtime base runs."""
    yaml = f"distros/{distro.name}.yaml"
    if distro.cuda is None:
        raise ConfigError(
            f"{yaml} has no cuda section, so recipes/{recipe.name}.yaml cannot target it",
            hint=f"add cuda: base_image, runtime_image, version to {yaml}, or drop {distro.name} "
            f"from the recipe's distros",
        )
    if recipe.cuda is None:
        raise ConfigError(f"recipes/{recipe.name}.yaml: device cuda without a cuda section")
    cuda, gpu = distro.cuda, recipe.cuda
    family = family_for(distro)
    mode: GpuMode = options.gpu_mode or gpu.mode
    torch = cuda_torch(Target.resolve(distro, recipe, gpu_mode=options.gpu_mode), options, cuda.torch_tag)
    if torch.index not in {"pytorch-cuda", "pypi"}:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: torch index {torch.index!r} has no CUDA builds of torch",
            hint="use torch.index pytorch-cuda (the build for the base's CUDA) or pypi",
        )

    wheel = next((w for w in gpu.wheels if w.arch == distro.arch), None)
    if mode == "wheel" and wheel is None:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: cuda.wheels has no {distro.arch} wheel for {distro.name}",
            hint="add the wheel's file name and sha256 from PyPI, or build with the source mode",
        )
    if mode == "source":
        if recipe.source is None or recipe.source.pypi is None:
            raise ConfigError(f"recipes/{recipe.name}.yaml: the source mode needs a source.pypi sdist pin")
        vllm_version = options.vllm_version or recipe.source.pypi.version
    else:
        vllm_version = gpu.wheel_version

    runtime_ref = _cuda_ref(distro, cuda.runtime_image, cuda.runtime_digest)
    devel_ref = _cuda_ref(distro, cuda.base_image, cuda.digest) if mode == "source" else None

    toolkit_install: str | None = None
    if mode == "source" and cuda.repo:
        if distro.family not in {"fedora", "ubi"}:
            raise ConfigError(
                f"{yaml}: cuda.repo is supported for RPM distros only",
                hint="use one of NVIDIA's CUDA images as cuda.base_image instead",
            )
        if not cuda.toolkit_packages:
            raise ConfigError(
                f"{yaml}: cuda.repo is set but cuda.toolkit_packages is empty",
                hint="list the toolkit packages to install from it (cuda-minimal-build-13-0, ...)",
            )
        repo_file = "/etc/yum.repos.d/" + cuda.repo.rsplit("/", 1)[-1]
        toolkit_install = f"curl -fsSL {shlex.quote(cuda.repo)} -o {repo_file} && " + family.install_command(
            cuda.toolkit_packages
        )

    header_fix: str | None = None
    if mode == "source" and cuda.glibc_rsqrt_fix:
        header_fix = glibc_rsqrt_fix(cuda.home)

    # nvcc compiles host code with the same compiler as the C++ sources, so vLLM's "GCC >= 13 with CUDA" gate and
    # nvcc's newest-GCC limit judge one compiler: the host compiler where declared, else the enabled toolset.
    compiler = cuda.host_compiler or distro.compiler_enable
    compile_env: dict[str, str] = {}
    build_packages: tuple[str, ...] = ()
    context: list[ContextItem] = [ContextItem(name="scripts", kind="script", origin="containers/scripts")]
    if mode == "source":
        assert recipe.source is not None and recipe.source.pypi is not None
        pin = recipe.source.pypi
        context.append(
            ContextItem(
                name=f"sources/{pin.name}-{pin.version}.tar.gz",
                kind="sdist",
                origin=f"PyPI {pin.name}=={pin.version} sha256:{pin.sha256}",
            )
        )
        # git: CMake clones CUTLASS, flash-attention and vLLM's other CUDA dependencies during the build.
        roles = ["c_compiler", "python", "python_headers", "build_tools", "git"]
        if "ccache" in distro.packages:
            roles.append("ccache")
        if not recipe.cmake_from_pip:
            roles.append("cmake")
        build_packages = tuple(family.packages(roles))  # type: ignore[arg-type]
        if cuda.host_compiler:
            build_packages += tuple(p for p in cuda.host_compiler.packages if p not in build_packages)
        compile_env.update(recipe.build_env)
        compile_env["MAX_JOBS"] = str(options.max_jobs)
        compile_env["NVCC_THREADS"] = str(gpu.nvcc_threads)
        compile_env["TORCH_CUDA_ARCH_LIST"] = options.cuda_arch_list or gpu.arch_list
        compile_env["CUDA_HOME"] = cuda.home
        if compiler:
            compile_env.update({"CC": compiler.cc, "CXX": compiler.cxx, "CUDAHOSTCXX": compiler.cxx})
        else:
            compile_env.update({"CC": "gcc", "CXX": "g++"})

    labels = image_labels(
        distro,
        recipe,
        version=vllm_version,
        base_name=runtime_ref,
        base_digest=(
            (options.base_digest or distro.base.digest or "unpinned")
            if runtime_ref == distro.base.local_tag
            else (cuda.runtime_digest or "unpinned")
        ),
        # A wheel build's source is the wheel's project, set below; only a source build names the sdist.
        with_source=mode == "source",
    )
    labels |= {
        "dev.forge.gpu.mode": mode,
        "dev.forge.cuda.version": cuda.version,
        "dev.forge.cuda.runtime": runtime_ref,
        "dev.forge.torch": f"{torch.requirement} from {torch.index_url or torch.index}",
    }
    if mode == "source":
        assert recipe.source is not None and recipe.source.pypi is not None and devel_ref is not None
        labels["dev.forge.cuda.devel"] = devel_ref
        labels["dev.forge.cuda.arch_list"] = compile_env["TORCH_CUDA_ARCH_LIST"]
    else:
        assert wheel is not None
        labels["dev.forge.wheel"] = f"{wheel.filename} sha256:{wheel.sha256}"
        labels["org.opencontainers.image.source"] = f"https://pypi.org/project/{gpu.wheel_project}/"

    build_args = image_build_args(
        {"RUNTIME_IMAGE": runtime_ref, **({"BASE_IMAGE": devel_ref} if devel_ref else {})}, options
    )

    runtime_packages = tuple(family.packages(["runtime"]))
    runtime_packages += tuple(p for p in cuda.runtime_packages if p not in runtime_packages)
    suffix = "" if mode == "source" else "-wheel"
    checks: tuple[str, ...] = ("import-vllm", "vllm-version", "torch-cuda", "runtime-toolchain")
    if recipe.serve_test:
        checks += ("serve-models-gpu",)

    return BuildPlan(
        distro=distro,
        recipe=recipe,
        target=recipe.target,
        base_ref=devel_ref or runtime_ref,
        image_tag=options.tag or f"forge/{distro.name}-{recipe.target}:{vllm_version}{suffix}",
        containerfile="Containerfile",
        template=recipe.template,
        final_stage="runtime",
        max_jobs=options.max_jobs,
        buildkit=options.buildkit,
        trust_ca_bundle=options.trust_ca_bundle,
        cmake_from_pip=recipe.cmake_from_pip,
        torch=torch,
        compile_env=compile_env,
        build_args=build_args,
        context=tuple(context),
        labels=labels,
        secrets=("ca_bundle",) if options.trust_ca_bundle else (),
        runtime_packages=runtime_packages,
        build_packages=build_packages,
        vllm_version=vllm_version,
        test_checks=checks,
        cuda=CudaPlan(
            mode=mode,
            version=cuda.version,
            devel_ref=devel_ref,
            runtime_ref=runtime_ref,
            home=cuda.home,
            torch_tag=cuda.torch_tag,
            arch_list=options.cuda_arch_list or gpu.arch_list,
            nvcc_threads=gpu.nvcc_threads,
            host_cxx=compiler.cxx if compiler and mode == "source" else None,
            toolkit_install=toolkit_install,
            header_fix=header_fix,
            wheel_requirement=f"{gpu.wheel_project}=={gpu.wheel_version}",
            wheel=wheel,
            build_python_packages=tuple(p for p in family.packages(["python"]) if p not in runtime_packages),
        ),
    )
