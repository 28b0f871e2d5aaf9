"""The executor on GPU plans: the CUDA bases it needs are checked first (a stop within seconds names what could
not be reached), wheel mode resolves no sdist, and the toolchain report names the compiler the compile used."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from builders.build import BuildOptions, build, parse_toolchain, toolchain_script
from builders.container import Engine
from builders.engines import make_plan
from builders.errors import BaseUnavailable
from builders.plan import PlanOptions
from builders.project import Project

SOURCE = Path(__file__).parents[1] / "preflight" / "fixtures" / "vllm-0.33.0"
NVCC_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0"""


def tool(folder: Path, name: str, output: str) -> Path:
    path = folder / name
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_toolchain_report_names_the_compiler_the_compile_used(project: Project, tmp_path: Path) -> None:
    plan = make_plan(project.distro("fedora-44"), project.recipe_for("gpu"), PlanOptions(max_jobs=1, gpu_mode="source"))
    assert plan.compile_env["CXX"] == "/usr/bin/g++-14"
    # A toolchain stage in miniature: the system gcc is GCC 16, the compat g++-14 the plan compiles with is 14.3.1.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool(bin_dir, "gcc", "16.0.1")
    compat = tool(bin_dir, "g++-14", "14.3.1")
    tool(bin_dir, "cmake", "cmake version 4.1.2\n\nCMake suite maintained and supported by Kitware")
    tool(bin_dir, "nvcc", NVCC_VERSION)
    (bin_dir / "python3").symlink_to(shutil.which("python3") or "/usr/bin/python3")
    here = replace(plan, compile_env={**plan.compile_env, "CXX": str(compat)})
    proc = subprocess.run(
        ["/bin/sh", "-c", toolchain_script(here)],
        capture_output=True,
        text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        check=False,
    )
    found = parse_toolchain(proc.returncode, proc.stdout, here)
    assert found["gcc"] == "14.3.1" and found["cxx"] == str(compat)
    assert found["cmake"] == "4.1.2" and found["nvcc"] == "13.0.88" and found["python"].count(".") == 2
    assert parse_toolchain(0, "FORGE gcc 14.3.1\n", here) == {}  # a tool that did not answer: no half report


def test_a_cpu_plan_reports_the_distro_compiler_and_no_nvcc(project: Project) -> None:
    plan = make_plan(
        project.distro("debian-13"), project.recipe_for("cpu"), PlanOptions(max_jobs=1, torch_version="2.14.0")
    )
    script = toolchain_script(plan)
    assert "nvcc" not in script and script.startswith(f'echo "FORGE gcc $({plan.compile_env.get("CXX", "gcc")} ')


def report_of(folder: Path) -> dict[str, object]:
    data = json.loads((folder / "report.json").read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.engine
def test_a_wheel_mode_build_stops_at_once_on_its_missing_cuda_base(
    project: Project, engine: Engine, tmp_path: Path
) -> None:
    ubuntu = project.distro("ubuntu-24.04")
    assert ubuntu.cuda is not None
    if engine.image_exists(ubuntu.cuda.runtime_image):
        pytest.skip("the CUDA runtime base is loaded here: the build would run")
    lines: list[str] = []
    start = time.monotonic()
    with pytest.raises(BaseUnavailable) as exc:
        build(
            project,
            ubuntu,
            project.recipe_for("gpu"),
            BuildOptions(gpu_mode="wheel", reports_dir=tmp_path, sbom=False),
            lines.append,
        )
    assert time.monotonic() - start < 60
    assert ubuntu.cuda.runtime_image in exc.value.message and "registry docker.io" in exc.value.message
    assert ubuntu.cuda.base_image not in exc.value.message  # wheel mode needs no devel base
    report = report_of(tmp_path)
    assert report["result"] == "failed" and report["source"] == {}
    # Cheapest first: the missing base stops the build before preflight and before any source is resolved.
    assert "base" in report["phases"]  # type: ignore[operator]
    phases = report["phases"]
    assert isinstance(phases, dict) and not {"preflight", "sources"} & set(phases)


@pytest.mark.engine
def test_a_source_build_on_fedora_44_names_its_base_that_cannot_be_had(
    project: Project, engine: Engine, tmp_path: Path
) -> None:
    f44 = project.distro("fedora-44")
    if engine.image_exists(f44.base.local_tag) or shutil.which("dnf"):
        pytest.skip("a Fedora 44 base is loaded or can be bootstrapped here")
    with pytest.raises(BaseUnavailable) as exc:
        build(
            project,
            f44,
            project.recipe_for("gpu"),
            BuildOptions(gpu_mode="source", reports_dir=tmp_path, source_overrides={"vllm": SOURCE}, sbom=False),
            lambda _line: None,
        )
    # Fedora has no NVIDIA image: its CUDA bases are the distro's own, which `forge bootstrap` makes.
    assert "registry.fedoraproject.org" in exc.value.message and exc.value.hint is not None
    assert "forge bootstrap fedora-44" in exc.value.hint
    report = report_of(tmp_path)
    # Cheapest first: the base that cannot be had is named before the source is even looked at.
    assert report["result"] == "failed" and report["source"] == {}
    assert "sources" not in report["phases"]  # type: ignore[operator]
