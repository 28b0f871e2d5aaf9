"""GPU plans for every CUDA distro × mode, without an engine: bases, compilers, arch list, torch index."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builders.config.models import Distro, GpuMode, TorchChoice
from builders.engines import make_plan
from builders.engines.vllm.plan import glibc_rsqrt_fix, make_cuda_plan
from builders.errors import ConfigError
from builders.plan import BuildPlan, PlanOptions
from builders.project import Project

GPU_DISTROS = ("fedora-44", "ubi-9", "ubuntu-24.04")
MODES: tuple[GpuMode, ...] = ("source", "wheel")
# Package names that would mean a compiler toolchain or the CUDA toolkit in the runtime stage.
TOOLCHAIN_PACKAGES = ("g++", "gcc-c++", "cmake", "ninja-build", "cuda-minimal-build", "cuda-nvcc", "gcc-toolset")


def gpu_plan(project: Project, distro: str, mode: GpuMode, **kw: object) -> BuildPlan:
    options: dict[str, object] = {"max_jobs": 3, "gpu_mode": mode}
    options.update(kw)
    return make_plan(project.distro(distro), project.recipe_for("gpu"), PlanOptions(**options))  # type: ignore[arg-type]


def test_the_gpu_target_lists_exactly_the_distros_with_a_cuda_section(project: Project) -> None:
    recipe = project.recipe_for("gpu")
    with_cuda = {d.name for d in project.distros.values() if d.cuda is not None}
    assert set(GPU_DISTROS) <= with_cuda
    assert {d.name for d, r in project.pairs() if r.target == "gpu"} == set(GPU_DISTROS)
    assert recipe.device == "cuda" and recipe.cuda is not None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("distro", GPU_DISTROS)
def test_torch_comes_from_the_cuda_index_matching_the_base(project: Project, distro: str, mode: GpuMode) -> None:
    plan = gpu_plan(project, distro, mode)
    cuda = project.distro(distro).cuda
    assert plan.cuda is not None and cuda is not None and plan.torch is not None
    tag = "cu" + cuda.version.replace(".", "")
    assert plan.cuda.torch_tag == tag == "cu130"
    assert plan.torch.requirement == f"torch==2.14.0+{tag}"
    assert plan.torch.index_url == f"https://download.pytorch.org/whl/{tag}"
    assert plan.labels["dev.forge.torch"] == f"torch==2.14.0+{tag} from https://download.pytorch.org/whl/{tag}"
    assert plan.labels["dev.forge.gpu.mode"] == mode and plan.labels["dev.forge.cuda.version"] == cuda.version


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("distro", GPU_DISTROS)
def test_runtime_has_no_toolchain_but_a_c_compiler_for_triton(project: Project, distro: str, mode: GpuMode) -> None:
    plan = gpu_plan(project, distro, mode)
    assert not [p for p in plan.runtime_packages if any(p.startswith(t) for t in TOOLCHAIN_PACKAGES)]
    assert "gcc" in plan.runtime_packages
    headers = project.distro(distro).packages["python_headers"]
    assert set(headers) <= set(plan.runtime_packages)
    assert plan.final_stage == "runtime"
    assert plan.labels["org.opencontainers.image.base.name"] == plan.build_args["RUNTIME_IMAGE"]


@pytest.mark.parametrize("distro", GPU_DISTROS)
def test_source_mode_compiles_for_the_recipe_arch_list(project: Project, distro: str) -> None:
    plan = gpu_plan(project, distro, "source")
    recipe = project.recipe_for("gpu")
    assert plan.cuda is not None and recipe.cuda is not None
    env = plan.compile_env
    assert env["VLLM_TARGET_DEVICE"] == "cuda"
    assert env["TORCH_CUDA_ARCH_LIST"] == recipe.cuda.arch_list == plan.labels["dev.forge.cuda.arch_list"]
    assert env["MAX_JOBS"] == "3" and env["NVCC_THREADS"] == str(recipe.cuda.nvcc_threads)
    assert env["CUDA_HOME"] == "/usr/local/cuda-13.0"
    assert any(i.kind == "sdist" and i.name == "sources/vllm-0.33.0.tar.gz" for i in plan.context)
    assert plan.build_args["BASE_IMAGE"] == plan.cuda.devel_ref == plan.base_ref
    # CMake clones CUTLASS and friends during a CUDA build.
    assert {"git", "git-core"} & set(plan.build_packages)
    assert plan.image_tag == f"forge/{distro}-gpu:0.33.0"


def test_arch_list_option_overrides_the_recipe(project: Project) -> None:
    plan = gpu_plan(project, "ubuntu-24.04", "source", cuda_arch_list="9.0")
    assert plan.compile_env["TORCH_CUDA_ARCH_LIST"] == "9.0" and plan.cuda is not None and plan.cuda.arch_list == "9.0"


def test_fedora_44_builds_with_gcc14_compat_as_cudahostcxx(project: Project) -> None:
    plan = gpu_plan(project, "fedora-44", "source")
    assert plan.cuda is not None
    env = plan.compile_env
    assert env["CUDAHOSTCXX"] == env["CXX"] == "/usr/bin/g++-14" == plan.cuda.host_cxx
    assert env["CC"] == "/usr/bin/gcc-14"
    assert {"gcc14", "gcc14-c++"} <= set(plan.build_packages)
    # Fedora has no NVIDIA image: the bootstrapped base builds and runs, nvcc comes from NVIDIA's repository.
    assert plan.cuda.devel_ref == plan.cuda.runtime_ref == "forge/base:fedora-44"
    assert plan.cuda.toolkit_install is not None
    assert "developer.download.nvidia.com/compute/cuda/repos/fedora42" in plan.cuda.toolkit_install
    assert "cuda-minimal-build-13-0" in plan.cuda.toolkit_install


def test_ubi_9_builds_with_gcc_toolset(project: Project) -> None:
    plan = gpu_plan(project, "ubi-9", "source")
    assert plan.cuda is not None
    toolset = "/opt/rh/gcc-toolset-14/root/usr/bin"
    assert plan.compile_env["CXX"] == plan.compile_env["CUDAHOSTCXX"] == f"{toolset}/g++"
    assert "gcc-toolset-14-gcc-c++" in plan.build_packages
    assert plan.cuda.devel_ref == "docker.io/nvidia/cuda:13.0.3-devel-ubi9"
    assert plan.cuda.runtime_ref == "docker.io/nvidia/cuda:13.0.3-runtime-ubi9"
    assert plan.cuda.toolkit_install is None  # NVIDIA's devel image carries nvcc


def test_ubuntu_24_04_uses_its_own_gcc_13(project: Project) -> None:
    plan = gpu_plan(project, "ubuntu-24.04", "source")
    assert plan.compile_env["CXX"] == "g++" and "CUDAHOSTCXX" not in plan.compile_env
    assert plan.cuda is not None and plan.cuda.host_cxx is None
    assert plan.cuda.devel_ref == "docker.io/nvidia/cuda:13.0.3-devel-ubuntu24.04"


@pytest.mark.parametrize("distro", GPU_DISTROS)
def test_wheel_mode_installs_the_pinned_official_wheel_and_compiles_nothing(project: Project, distro: str) -> None:
    plan = gpu_plan(project, distro, "wheel")
    recipe = project.recipe_for("gpu")
    assert plan.cuda is not None and plan.cuda.wheel is not None and recipe.cuda is not None
    assert plan.cuda.wheel_requirement == f"vllm=={recipe.cuda.wheel_version}"
    assert plan.cuda.wheel.arch == project.distro(distro).arch
    assert plan.labels["dev.forge.wheel"].endswith(plan.cuda.wheel.sha256)
    assert plan.build_packages == () and plan.compile_env == {}
    assert "BASE_IMAGE" not in plan.build_args and plan.cuda.devel_ref is None
    assert plan.base_ref == plan.cuda.runtime_ref
    assert not any(i.kind == "sdist" for i in plan.context)
    assert plan.image_tag == f"forge/{distro}-gpu:0.33.0-wheel"


def test_default_mode_is_the_recipes(project: Project) -> None:
    recipe = project.recipe_for("gpu")
    assert recipe.cuda is not None
    plan = make_plan(project.distro("ubuntu-24.04"), recipe, PlanOptions(max_jobs=1))
    assert plan.cuda is not None and plan.cuda.mode == recipe.cuda.mode


def test_a_torch_pin_read_from_the_source_gets_the_cuda_label(project: Project) -> None:
    plan = gpu_plan(project, "ubi-9", "source", torch_version="2.14.0+cpu")
    assert plan.torch is not None and plan.torch.requirement == "torch==2.14.0+cu130"


def test_pypi_torch_keeps_a_plain_version_and_a_cpu_index_is_refused(project: Project) -> None:
    plan = gpu_plan(project, "ubuntu-24.04", "wheel", torch_index="pypi")
    assert plan.torch is not None and plan.torch.requirement == "torch==2.14.0" and plan.torch.index == "pypi"
    with pytest.raises(ConfigError, match="no CUDA builds of torch"):
        gpu_plan(project, "ubuntu-24.04", "wheel", torch_index="pytorch-cpu")


def test_pinned_digests_reach_the_references_and_labels(project: Project) -> None:
    ubuntu = project.distro("ubuntu-24.04")
    assert ubuntu.cuda is not None
    devel, runtime = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    pinned = ubuntu.model_copy(
        update={"cuda": ubuntu.cuda.model_copy(update={"digest": devel, "runtime_digest": runtime})}
    )
    plan = make_plan(pinned, project.recipe_for("gpu"), PlanOptions(max_jobs=1, gpu_mode="source"))
    assert plan.build_args["BASE_IMAGE"] == f"docker.io/nvidia/cuda:13.0.3-devel-ubuntu24.04@{devel}"
    assert plan.build_args["RUNTIME_IMAGE"] == f"docker.io/nvidia/cuda:13.0.3-runtime-ubuntu24.04@{runtime}"
    assert plan.labels["org.opencontainers.image.base.digest"] == runtime


def test_a_distro_without_cuda_facts_is_a_config_error(project: Project) -> None:
    with pytest.raises(ConfigError, match=r"distros/debian-13\.yaml has no cuda section"):
        make_cuda_plan(project.distro("debian-13"), project.recipe_for("gpu"), PlanOptions(max_jobs=1))


def test_a_repo_on_a_deb_distro_is_refused(project: Project) -> None:
    ubuntu: Distro = project.distro("ubuntu-24.04")
    assert ubuntu.cuda is not None
    with_repo = ubuntu.model_copy(
        update={"cuda": ubuntu.cuda.model_copy(update={"repo": "https://example.invalid/cuda.list"})}
    )
    with pytest.raises(ConfigError, match="RPM distros only"):
        make_plan(with_repo, project.recipe_for("gpu"), PlanOptions(max_jobs=1, gpu_mode="source"))


def test_cuda_recipe_without_a_cuda_section_is_rejected_when_loaded(project: Project) -> None:
    cpu = project.recipe_for("cpu").model_dump()
    cpu.update({"device": "cuda", "torch": TorchChoice(index="pytorch-cuda").model_dump(), "cuda": None})
    with pytest.raises(ValueError, match="device=cuda needs a cuda section"):
        type(project.recipe_for("cpu")).model_validate(cpu)


# The two declarations as CUDA 13.0.88's crt/math_functions.h (lines 629 and 653) writes them.
CUDA_13_0_RSQRT = (
    "extern __DEVICE_FUNCTIONS_DECL__ __device_builtin__ double                 rsqrt(double x);\n"
    "extern __DEVICE_FUNCTIONS_DECL__ __device_builtin__ float                  rsqrtf(float x);\n"
)


def test_only_fedora_44_source_builds_adapt_the_cuda_header_to_glibc(project: Project) -> None:
    for distro in GPU_DISTROS:
        for mode in MODES:
            plan = gpu_plan(project, distro, mode)
            assert plan.cuda is not None
            wanted = distro == "fedora-44" and mode == "source"
            assert (plan.cuda.header_fix is not None) == wanted, (distro, mode)
    assert project.distro("fedora-44").toolchain.glibc >= "2.42"


def test_the_header_fix_guards_rsqrt_by_glibc_and_refuses_a_changed_header(tmp_path: Path) -> None:
    header = tmp_path / "include" / "crt" / "math_functions.h"
    header.parent.mkdir(parents=True)
    header.write_text("/* before */\n" + CUDA_13_0_RSQRT + "/* after */\n")
    fix = glibc_rsqrt_fix(str(tmp_path))
    subprocess.run(["bash", "-o", "pipefail", "-c", fix], check=True)
    text = header.read_text()
    assert text.count("#if __GLIBC_PREREQ(2, 42) && __GLIBC_USE(IEC_60559_FUNCS_EXT_C23)") == 2
    assert "rsqrt(double x) __THROW;\n#else\n" in text and "rsqrtf(float x) __THROW;\n#else\n" in text
    assert text.startswith("/* before */\n") and text.endswith("/* after */\n")
    # Applied once: a second run leaves the header alone.
    subprocess.run(["bash", "-o", "pipefail", "-c", fix], check=True)
    assert header.read_text() == text


def test_the_header_fix_stops_at_a_header_it_does_not_know(tmp_path: Path) -> None:
    header = tmp_path / "include" / "crt" / "math_functions.h"
    header.parent.mkdir(parents=True)
    changed = CUDA_13_0_RSQRT.replace("rsqrtf(float x);", "rsqrtf(float x) __THROW;")
    header.write_text(changed)
    done = subprocess.run(["bash", "-o", "pipefail", "-c", glibc_rsqrt_fix(str(tmp_path))], check=False)
    assert done.returncode != 0 and header.read_text() == changed
