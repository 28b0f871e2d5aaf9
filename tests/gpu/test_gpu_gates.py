"""The GPU distros against the preflight gates (builders/preflight): nvcc's newest host GCC, and vLLM's own
"GCC >= 13 is required to build vLLM with CUDA", read from the vLLM source. The plan must build with the
compiler the gates judged, and the remedy must name what the plan then uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.config.models import Distro
from builders.engines import make_plan
from builders.engines.vllm import gates
from builders.engines.vllm.source_facts import SourceFacts, read_source_facts
from builders.gates.findings import Finding
from builders.plan import PlanOptions
from builders.preflight import run_preflight
from builders.project import Project

SOURCE = Path(__file__).parents[1] / "preflight" / "fixtures" / "vllm-0.33.0"


@pytest.fixture(scope="module")
def facts() -> SourceFacts:
    return read_source_facts(SOURCE)


def nvcc_gate(distro: Distro, host_gcc: str, origin: str) -> Finding:
    assert distro.cuda is not None
    return gates.nvcc_host_gcc_gate(
        cuda_version=distro.cuda.version,
        host_gcc=host_gcc,
        host_gcc_origin=origin,
        max_major=gates.max_gcc_for_cuda(distro.cuda.version),
        max_source="CUDA_MAX_GCC",
        family=distro.family,
        distro_name=distro.name,
    )


def vllm_cuda_gate(facts: SourceFacts, distro: Distro, gcc: str) -> Finding:
    found = gates.gcc_gates(facts, gcc=gcc, gcc_origin="yaml", device="cuda", arch=distro.arch, distro_name=distro.name)
    (cuda_gate,) = [f for f in found if f.required == "≥ 13"]
    return cuda_gate


def test_the_cuda_gcc_gate_is_read_from_the_source(facts: SourceFacts) -> None:
    cuda_gates = [g for g in facts.gates_for("cuda", "x86_64") if "with CUDA" in g.message]
    assert [(g.file, g.specifier) for g in cuda_gates] == [("CMakeLists.txt", ">=13")]
    assert not [g for g in facts.gates_for("cpu", "x86_64") if "with CUDA" in g.message]


def test_fedora_44_without_the_compat_compiler_is_blocked_with_the_remedy_the_plan_follows(project: Project) -> None:
    f44 = project.distro("fedora-44")
    assert f44.cuda is not None and f44.cuda.host_compiler is not None
    blocked = nvcc_gate(f44, f44.toolchain.gcc, "distros/fedora-44.yaml: toolchain.gcc")
    assert blocked.blocking and blocked.gate == "nvcc-host-gcc" and blocked.found.startswith("GCC 16")
    # The remedy names compat packages and a CUDAHOSTCXX of the newest GCC nvcc 13.0 takes (15); fedora-44.yaml
    # declares the same kind of compat compiler, one release older, and the plan compiles with it.
    assert "gcc15 gcc15-c++" in blocked.remedy and "CUDAHOSTCXX=/usr/bin/g++-15" in blocked.remedy
    plan = make_plan(f44, project.recipe_for("gpu"), PlanOptions(max_jobs=1, gpu_mode="source"))
    major = f44.cuda.host_compiler.gcc.split(".")[0]
    assert plan.compile_env["CUDAHOSTCXX"] == f"/usr/bin/g++-{major}" == plan.compile_env["CXX"]
    assert tuple(f44.cuda.host_compiler.packages) == (f"gcc{major}", f"gcc{major}-c++")
    assert int(major) <= 15


def test_fedora_44_with_the_compat_compiler_clears_both_gates(project: Project, facts: SourceFacts) -> None:
    f44 = project.distro("fedora-44")
    assert f44.cuda is not None and f44.cuda.host_compiler is not None
    host = f44.cuda.host_compiler.gcc
    assert nvcc_gate(f44, host, "distros/fedora-44.yaml: cuda.host_compiler.gcc").passed
    assert vllm_cuda_gate(facts, f44, host).passed


def test_ubi_9_gcc_toolset_clears_vllms_cuda_gate_and_the_system_gcc_would_not(
    project: Project, facts: SourceFacts
) -> None:
    ubi9 = project.distro("ubi-9")
    assert ubi9.compiler_enable is not None and ubi9.toolchain.gcc == "11.5"
    with_toolset = vllm_cuda_gate(facts, ubi9, ubi9.compiler_enable.gcc)
    assert with_toolset.passed and with_toolset.source.startswith("CMakeLists.txt:")
    system = vllm_cuda_gate(facts, ubi9, ubi9.toolchain.gcc)
    assert system.blocking and system.found == "GCC 11.5" and system.source == with_toolset.source
    assert "compiler" in system.remedy
    # nvcc 13.0 itself accepts either; the toolset is what the plan compiles with.
    assert nvcc_gate(ubi9, ubi9.compiler_enable.gcc, "compiler_enable").passed
    plan = make_plan(ubi9, project.recipe_for("gpu"), PlanOptions(max_jobs=1, gpu_mode="source"))
    assert plan.compile_env["CXX"].startswith(ubi9.compiler_enable.prefix)


def test_ubuntu_24_04_gcc_13_clears_both_gates(project: Project, facts: SourceFacts) -> None:
    ubuntu = project.distro("ubuntu-24.04")
    assert nvcc_gate(ubuntu, ubuntu.toolchain.gcc, "toolchain.gcc").passed
    assert vllm_cuda_gate(facts, ubuntu, ubuntu.toolchain.gcc).passed


@pytest.mark.parametrize("distro", ["fedora-44", "ubi-9", "ubuntu-24.04"])
def test_preflight_of_the_gpu_recipe_has_no_compiler_blocker(project: Project, distro: str, tmp_path: Path) -> None:
    report = run_preflight(
        project,
        project.distro(distro),
        project.recipe_for("gpu"),
        engine=None,
        source=SOURCE,
        max_jobs=1,
        scratch_dir=tmp_path,
        probe=False,
    )
    compiler = [f for f in (*report.findings, *report.passed) if f.gate in {"gcc", "nvcc-host-gcc"}]
    assert {f.gate for f in compiler} == {"gcc", "nvcc-host-gcc"}
    assert not [f for f in compiler if f.blocking], [f.found for f in compiler if f.blocking]
