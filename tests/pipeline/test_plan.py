"""distro + recipe + options → BuildPlan, without an engine."""

from __future__ import annotations

import pytest

from builders.engines import make_plan
from builders.errors import UsageError
from builders.plan import PlanOptions
from builders.project import Project


def opts(**kw: object) -> PlanOptions:
    base: dict[str, object] = {"max_jobs": 2, "torch_version": "2.14.0+cpu"}
    base.update(kw)
    return PlanOptions(**base)  # type: ignore[arg-type]


def test_source_plan_for_debian_13(project: Project) -> None:
    plan = make_plan(project.distro("debian-13"), project.recipe_for("cpu"), opts())
    assert plan.base_ref == "forge/base:debian-13"
    assert plan.compile_env["VLLM_TARGET_DEVICE"] == "cpu"
    assert plan.compile_env["MAX_JOBS"] == "2"
    assert plan.compile_env["VLLM_CPU_X86"] == "1"
    assert plan.compile_env["FETCHCONTENT_SOURCE_DIR_ONEDNN"] == "/opt/src/onednn"
    assert "libnuma-dev" in plan.build_packages and "cmake" in plan.build_packages
    assert "libspdlog-dev" in plan.build_packages  # Debian's oneDNN source uses the system spdlog
    assert "cmake" not in plan.runtime_packages and "libnuma-dev" not in plan.runtime_packages
    assert "g++" in plan.runtime_packages  # torch.compile needs it when vLLM starts
    assert plan.torch is not None and plan.torch.requirement == "torch==2.14.0+cpu"
    assert plan.labels["dev.forge.source.sha256"].startswith("f4c33c25")
    assert plan.image_tag == "forge/debian-13-cpu:0.33.0"


def test_pypi_torch_is_the_cuda_build_and_needs_the_stub(project: Project) -> None:
    plan = make_plan(project.distro("debian-13"), project.recipe_for("cpu"), opts(torch_index="pypi"))
    assert plan.torch is not None
    assert plan.torch.requirement == "torch==2.14.0"  # no local label off PyTorch's index
    assert plan.torch.cuda_build_on_cpu
    assert "torch_cudart_stub.cmake" in plan.compile_env["CMAKE_ARGS"]


def test_cmake_from_pip_drops_the_distro_cmake(project: Project) -> None:
    plan = make_plan(project.distro("debian-12"), project.recipe_for("cpu"), opts(cmake_from_pip=True))
    assert "cmake" not in plan.build_packages and plan.cmake_from_pip


def test_ubi9_uses_gcc_toolset(project: Project) -> None:
    plan = make_plan(project.distro("ubi-9"), project.recipe_for("cpu"), opts())
    assert plan.compile_env["CXX"] == "/opt/rh/gcc-toolset-14/root/usr/bin/g++"
    assert "gcc-toolset-14-gcc-c++" in plan.build_packages


def test_wheel_plan_takes_version_from_requirements(project: Project) -> None:
    plan = make_plan(project.distro("debian-12"), project.recipe_for("cpu-wheel"), PlanOptions(max_jobs=1))
    assert plan.vllm_version == "0.32.0"
    assert any(i.kind == "wheelhouse" for i in plan.context)
    assert plan.torch is not None and plan.torch.index == "wheelhouse"


def test_null_torch_pin_without_source_is_an_error(project: Project) -> None:
    with pytest.raises(UsageError, match=r"torch\.version is null"):
        make_plan(project.distro("debian-13"), project.recipe_for("cpu"), PlanOptions(max_jobs=2))


def test_ca_bundle_becomes_a_secret_only_with_buildkit(project: Project) -> None:
    with_bk = make_plan(project.distro("debian-13"), project.recipe_for("cpu"), opts(trust_ca_bundle=True))
    assert with_bk.secrets == ("ca_bundle",)
    none = make_plan(project.distro("debian-13"), project.recipe_for("cpu"), opts(trust_ca_bundle=False))
    assert none.secrets == ()


def test_plan_of_an_unsupported_pair_is_a_usage_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    from builders.cli import main

    rc = main(["plan", "debian-13", "gpu"])
    err = capsys.readouterr().err
    assert rc == UsageError.exit_code == 2
    assert "usage error: recipes/vllm-gpu.yaml does not support debian-13" in err and "Traceback" not in err
    assert "its distros: " in err and "fedora-44" in err
