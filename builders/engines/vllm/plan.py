"""vLLM's build plans: the CPU image (compiled from the sdist or installed from a wheelhouse; the router's image
rides the same plan), the CUDA image on NVIDIA's bases (`make_cuda_plan`) and the CUDA image from PyPI's wheels
(gpu_wheel.py). Pure, as every planner is; vLLM's engine (builders/engines/vllm/__init__.py) calls it.
"""

from __future__ import annotations

import shlex

from builders.config.models import Distro, GpuMode, Recipe
from builders.distros import family_for
from builders.engines.vllm.gpu_wheel import make_gpu_wheel_plan
from builders.engines.vllm.recipe import vllm_recipe
from builders.errors import ConfigError
from builders.plan import (
    BuildPlan,
    ContextItem,
    CudaPlan,
    PlanOptions,
    cuda_torch,
    image_build_args,
    image_labels,
    torch_spec,
)
from builders.platforms import isa_for, platform_of
from builders.target import Target

# The version a tree that states none (a checkout without PKG-INFO, whose .git is not staged) is built as.
UNKNOWN_TREE_VERSION = "0.0.0.dev0+forge.tree"
# Where a source tree's three parts lie in the build context (builders/build.py stages them from the split).
TREE_DIR = "sources/vllm-tree"
TREE_PARTS = {"requirements": "requirements", "compiler_inputs": "compiler-inputs", "package": "package"}


def tree_context() -> list[ContextItem]:
    """The context items of a source-tree build: one folder per part, each COPYed by its own layer."""
    return [
        ContextItem(
            name=f"{TREE_DIR}/requirements", kind="tree-requirements", origin="--source vllm=DIR: requirements"
        ),
        ContextItem(
            name=f"{TREE_DIR}/compiler-inputs", kind="tree-compiler-inputs", origin="--source vllm=DIR: compiler inputs"
        ),
        ContextItem(name=f"{TREE_DIR}/package", kind="tree-package", origin="--source vllm=DIR: Python package"),
    ]


def make_vllm_plan(distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
    """make_plan for a recipe that is not kind=native: which of vLLM's three plans it takes."""
    target = Target.resolve(distro, recipe, gpu_mode=options.gpu_mode)
    if target.cuda and target.from_wheelhouse:
        # CUDA from PyPI's wheels on a plain distro base: no NVIDIA image.
        return make_gpu_wheel_plan(distro, recipe, options)
    if target.cuda:
        return make_cuda_plan(distro, recipe, options)
    return make_cpu_plan(distro, recipe, options)


def make_cpu_plan(distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
    """The CPU image: vLLM compiled from its sdist or installed from a wheelhouse, or the router's Python app."""
    target = Target.resolve(distro, recipe, gpu_mode=options.gpu_mode)
    family = family_for(distro)
    torch = torch_spec(target, options)
    cmake_from_pip = vllm_recipe(recipe).cmake_from_pip if options.cmake_from_pip is None else options.cmake_from_pip

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
        if options.source_tree:
            context.extend(tree_context())
            # setuptools-scm reads the version from .git or PKG-INFO; a checkout's .git is never staged.
            compile_env["SETUPTOOLS_SCM_PRETEND_VERSION"] = vllm_version or UNKNOWN_TREE_VERSION
        elif recipe.source.pypi:
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
        # A tree is not the pinned sdist: its sha256 would name a file this image was not built from.
        with_source=not options.source_tree,
    )
    if options.source_tree:
        labels["dev.forge.source"] = "source tree (--source vllm=DIR)"
    labels["dev.forge.platform"] = platform_of(distro).name
    if torch:
        labels["dev.forge.torch"] = f"{torch.requirement} from {torch.index}"

    build_args = image_build_args({"BASE_IMAGE": base_ref}, options)

    checks: tuple[str, ...] = ()
    if target.device != "none":  # the image carries vLLM, not the router alone
        checks = ("import-vllm", "vllm-version", "cpu-kernels", "bytecode", "tcmalloc-mapped")
        checks += ("model-info-warm",) if vllm_recipe(recipe).warm_model_classes else ()
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
            family.packages(
                ["runtime", "c_compiler", "python_headers"] if vllm_recipe(recipe).runtime_jit_compiler else ["runtime"]
            )
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
        if not vllm_recipe(recipe).cmake_from_pip:
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
        cmake_from_pip=vllm_recipe(recipe).cmake_from_pip,
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
