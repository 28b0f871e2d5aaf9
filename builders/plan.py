"""distro + recipe + options → BuildPlan. Pure: no engine, no network, no filesystem writes.

The executor (builders/build.py) stages what the plan names and runs it; tests check plans in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from builders.config.models import Distro, Recipe
from builders.distros import family_for

TORCH_INDEXES = {
    "pytorch-cpu": "https://download.pytorch.org/whl/cpu",
    "pytorch-cuda": "https://download.pytorch.org/whl/cu130",
    "pypi": "https://pypi.org/simple",
}

# Where the build stages its work inside the container: /tmp may be a small tmpfs on some hosts and bases.
BUILD_DIR = "/var/tmp/forge"


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
    max_jobs: int
    buildkit: bool = True
    ca_bundle: bool = False
    torch_version: str | None = None
    torch_index: str | None = None
    cmake_from_pip: bool | None = None
    vllm_version: str | None = None
    base_digest: str | None = None
    source_date_epoch: int | None = None
    tag: str | None = None


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
    ca_bundle: bool
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

    @property
    def session_id(self) -> str:
        return f"{self.distro.name}-{self.target}"


def torch_spec(recipe: Recipe, options: PlanOptions) -> TorchSpec | None:
    if recipe.device == "none":
        return None
    index = options.torch_index or recipe.torch.index
    version = options.torch_version or recipe.torch.version
    if version is None:
        raise ValueError(
            f"recipes/{recipe.name}.yaml: torch.version is null (vLLM's pin) and no pin was read from the source"
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
        cuda_build_on_cpu=recipe.device == "cpu" and index == "pypi",
    )


def make_plan(distro: Distro, recipe: Recipe, options: PlanOptions) -> BuildPlan:
    if not recipe.supports(distro.name):
        raise ValueError(f"recipes/{recipe.name}.yaml does not support distro {distro.name}")
    family = family_for(distro)
    torch = torch_spec(recipe, options)
    cmake_from_pip = recipe.cmake_from_pip if options.cmake_from_pip is None else options.cmake_from_pip

    base_ref = distro.base.local_tag
    vllm_version = options.vllm_version
    if recipe.source and recipe.source.pypi:
        vllm_version = vllm_version or recipe.source.pypi.version
    if recipe.wheelhouse:
        pins = [r.split("==", 1)[1] for r in recipe.wheelhouse.requirements if r.startswith("vllm") and "==" in r]
        vllm_version = vllm_version or (pins[0] if pins else None)
    tag = options.tag or f"forge/{distro.name}-{recipe.target}:{vllm_version or 'latest'}"

    context: list[ContextItem] = [ContextItem(name="scripts", kind="script", origin="containers/scripts")]
    build_roles: list[str] = []
    compile_env: dict[str, str] = {}
    if recipe.kind == "source":
        assert recipe.source is not None
        if recipe.source.pypi:
            sdist = f"{recipe.source.pypi.name}-{recipe.source.pypi.version}.tar.gz"
            context.append(ContextItem(name=f"sources/{sdist}", kind="sdist",
                                       origin=f"PyPI {recipe.source.pypi.name}=={recipe.source.pypi.version} "
                                       f"sha256:{recipe.source.pypi.sha256}"))
        else:
            assert recipe.source.git is not None
            context.append(ContextItem(name="sources/vllm", kind="source-dir",
                                       origin=f"{recipe.source.git.url}@{recipe.source.git.ref}"))
        for fetched in recipe.fetched_sources:
            context.append(ContextItem(name=f"sources/{fetched.name}", kind="source-dir",
                                       origin=f"{fetched.name} (pinned in {fetched.pinned_in})"))
            compile_env[fetched.cmake_var] = f"/opt/src/{fetched.name}"
        build_roles = ["c_compiler", "numa_headers", "tcmalloc", "python", "python_headers", "build_tools"]
        if "ccache" in distro.packages:
            build_roles.append("ccache")
        if not cmake_from_pip:
            build_roles.append("cmake")
        compile_env.update(recipe.build_env)
        compile_env.update(recipe.isa)
        compile_env["MAX_JOBS"] = str(options.max_jobs)
        compile_env.update({k: v for k, v in family.compiler_env().items() if k != "PATH"})
        if torch and torch.cuda_build_on_cpu:
            compile_env["CMAKE_ARGS"] = "-DCMAKE_PROJECT_INCLUDE=/opt/forge/scripts/torch_cudart_stub.cmake"
    if torch and torch.index == "wheelhouse" or recipe.kind == "wheel":
        context.append(ContextItem(name="wheelhouse", kind="wheelhouse", origin="local wheels (--wheelhouse)"))
    if recipe.kind == "python-app":
        context.append(ContextItem(name="app", kind="package", origin="this checkout's builders/ package"))
        build_roles = ["python"]

    build_packages = tuple(family.packages(build_roles))  # type: ignore[arg-type]
    if recipe.kind == "source":
        extra = [p for f in recipe.fetched_sources for p in f.build_depends if distro.family in {"debian", "ubuntu"}]
        build_packages += tuple(p for p in extra if p not in build_packages)

    labels = {
        "org.opencontainers.image.title": f"{recipe.name} on {distro.name}",
        "org.opencontainers.image.description": recipe.description,
        "org.opencontainers.image.version": vllm_version or "",
        "org.opencontainers.image.base.name": distro.base.pinned_ref,
        "org.opencontainers.image.base.digest": options.base_digest or distro.base.digest or "unpinned",
        "org.opencontainers.image.vendor": "Forge",
        "dev.forge.recipe": recipe.name,
        "dev.forge.distro": distro.name,
        "dev.forge.target": recipe.target,
    }
    if recipe.source and recipe.source.pypi:
        labels["dev.forge.source.sha256"] = recipe.source.pypi.sha256
        labels["org.opencontainers.image.source"] = f"https://pypi.org/project/{recipe.source.pypi.name}/"
    if torch:
        labels["dev.forge.torch"] = f"{torch.requirement} from {torch.index}"

    build_args = {"BASE_IMAGE": base_ref}
    if options.source_date_epoch is not None:
        build_args["SOURCE_DATE_EPOCH"] = str(options.source_date_epoch)

    checks: tuple[str, ...] = ()
    if recipe.device != "none":
        checks = ("import-vllm", "vllm-version", "tcmalloc-mapped") + (("serve-models",) if recipe.serve_test else ())
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
        ca_bundle=options.ca_bundle,
        cmake_from_pip=cmake_from_pip,
        torch=torch,
        compile_env=compile_env,
        build_args=build_args,
        context=tuple(context),
        labels=labels,
        secrets=("ca_bundle",) if options.ca_bundle else (),
        runtime_packages=tuple(family.packages(["runtime"])),
        build_packages=build_packages,
        vllm_version=vllm_version,
        test_checks=checks,
    )
