"""Debian 12 cannot build vLLM's x86 CPU backend: preflight says why at once; a forced build proves it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from builders.bootstrap import ensure_base
from builders.build import BuildOptions, build
from builders.container import Engine
from builders.diagnose import diagnose_file
from builders.errors import BuildFailed
from builders.preflight import Finding, PreflightReport, run_preflight
from builders.project import Project
from builders.sources import cache_dir, fetch_debian_source, fetch_wheelhouse, resolve_sdist

pytestmark = [pytest.mark.engine]


def _all(report: PreflightReport, gate: str) -> list[Finding]:
    """Every finding of a gate, passed or not (report.finding returns only the first)."""
    return [f for f in (*report.findings, *report.passed) if f.gate == gate]


def test_preflight_blocks_debian_12_on_the_source_gates(project: Project, engine: Engine) -> None:
    distro, recipe = project.distro("debian-12"), project.recipe_for("cpu")
    ensure_base(distro, engine)
    sdist = resolve_sdist(recipe, project.root, {}).path
    report = run_preflight(
        project, distro, recipe, engine=engine, source=sdist, max_jobs=2, scratch_dir=Path(tempfile.gettempdir())
    )
    assert report.blocked and report.mode == "probed"
    # Both of vLLM's GCC gates, each judged: the x86 backend's ≥ 12.3 blocks, the project-wide ≥ 11.3 passes.
    gcc = {f.source.split(":")[0]: f for f in _all(report, "gcc")}
    assert set(gcc) == {"CMakeLists.txt", "cmake/cpu_extension.cmake"}
    x86 = gcc["cmake/cpu_extension.cmake"]
    assert x86.blocking and x86.found.startswith("GCC 12.2") and x86.required == "≥ 12.3"
    assert gcc["CMakeLists.txt"].passed and gcc["CMakeLists.txt"].required == "≥ 11.3"
    cmake = report.finding("cmake")
    assert cmake is not None and cmake.blocking and "3.25" in cmake.found and "3.26" in cmake.required
    assert cmake.source.startswith("CMakeLists.txt:")


def test_preflight_passes_debian_13_on_those_gates(project: Project, engine: Engine) -> None:
    distro, recipe = project.distro("debian-13"), project.recipe_for("cpu")
    ensure_base(distro, engine)
    sdist = resolve_sdist(recipe, project.root, {}).path
    report = run_preflight(
        project, distro, recipe, engine=engine, source=sdist, max_jobs=2, scratch_dir=Path(tempfile.gettempdir())
    )
    # Every GCC and CMake gate was evaluated against the probed toolchain and met: none missing, none skipped.
    gcc = _all(report, "gcc")
    assert len(gcc) == 2 and all(f.passed for f in gcc), gcc
    assert {f.required for f in gcc} == {"≥ 11.3", "≥ 12.3"}
    cmake = _all(report, "cmake")
    assert len(cmake) == 1 and cmake[0].passed and cmake[0].found.startswith("CMake 3.31"), cmake


@pytest.mark.slow
def test_forced_debian_12_build_fails_at_vllms_own_gate(project: Project, engine: Engine, tmp_path: Path) -> None:
    """--skip-preflight: the compile's configure step stops at cpu_extension.cmake's gate, and diagnosis says so.

    CMake comes from PyPI here (--cmake-from-pip) so the build gets past CMake's own version check to the GCC
    gate; torch is the local 2.13.0 CPU wheel, since only configure runs.
    """
    distro, recipe = project.distro("debian-12"), project.recipe_for("cpu")
    onednn = recipe.fetched_sources[0]
    carrier = project.distro(onednn.debian_source_distro or distro.name)
    ensure_base(carrier, engine)
    fetch_debian_source(onednn, carrier, engine, project.root)
    wheelhouse = fetch_wheelhouse(project.recipe_for("cpu-wheel"), distro, project.root)
    tag = "forge/test-debian-12-cpu:must-not-exist"
    with pytest.raises(BuildFailed):
        build(
            project,
            distro,
            recipe,
            BuildOptions(
                skip_preflight=True,
                cmake_from_pip=True,
                torch_index="wheelhouse",
                torch_version="2.13.0",
                wheelhouse=wheelhouse,
                max_jobs=1,
                tag=tag,
                reports_dir=tmp_path,
                skip_tests=True,
            ),
            lambda _line: None,
        )
    assert not engine.image_exists(tag)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["result"] == "failed"
    assert report["diagnosis"]["category"] == "gcc-gate"
    assert "X86 backend requires gcc/g++ >= 12.3" in report["diagnosis"]["line"]
    again = diagnose_file(tmp_path / "build.log")
    assert again.category == "gcc-gate" and again.line_number == report["diagnosis"]["line_number"]
    assert cache_dir(project.root).exists()
