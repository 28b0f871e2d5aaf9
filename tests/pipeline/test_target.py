"""Target.resolve: what a distro × recipe × --gpu-mode means, decided once for preflight, build and CI."""

from __future__ import annotations

from builders.config import Project
from builders.target import Target


def test_each_kind_of_target(project: Project) -> None:
    d13 = project.distro("debian-13")
    cpu = Target.resolve(d13, project.recipe_for("cpu"))
    assert cpu.compiles and cpu.cpu and cpu.runs_vllm and cpu.installs_torch and not cpu.cuda
    wheel = Target.resolve(d13, project.recipe_for("cpu-wheel"))
    assert not wheel.compiles and wheel.cpu and wheel.installs_torch
    router = Target.resolve(d13, project.recipe_for("router"))
    assert not (router.compiles or router.runs_vllm or router.installs_torch or router.cpu)


def test_gpu_mode_decides_whether_a_gpu_target_compiles(project: Project) -> None:
    f44, gpu = project.distro("fedora-44"), project.recipe_for("gpu")
    assert gpu.cuda is not None
    default = Target.resolve(f44, gpu)
    assert default.cuda and default.gpu_mode == gpu.cuda.mode
    source = Target.resolve(f44, gpu, gpu_mode="source")
    wheel = Target.resolve(f44, gpu, gpu_mode="wheel")
    assert source.compiles and not source.gpu_wheel
    assert wheel.gpu_wheel and not wheel.compiles and wheel.installs_torch
    # No cuda section in the distro file: no mode to speak of (preflight blocks on that instead).
    bare = Target.resolve(project.distro("ubuntu-22.04"), gpu, gpu_mode="wheel")
    assert bare.gpu_mode is None and bare.cuda
