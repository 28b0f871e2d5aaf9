"""Debian 12 cannot build vLLM's x86 CPU backend: preflight says why at once; a forced build proves it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from builders.bootstrap import ensure_base
from builders.build import BuildOptions, build
from builders.config import Project
from builders.diagnose import diagnose_file
from builders.engine import Engine
from builders.errors import BuildFailed
from builders.preflight import run_preflight
from builders.sources import cache_dir, fetch_debian_source, fetch_wheelhouse, resolve_sdist

pytestmark = [pytest.mark.engine]


def test_preflight_blocks_debian_12_on_the_source_gates(project: Project, engine: Engine) -> None:
    distro, recipe = project.distro("debian-12"), project.recipe_for("cpu")
    ensure_base(distro, engine)
    sdist = resolve_sdist(recipe, project.root, {}).path
    report = run_preflight(
        project, distro, recipe, engine=engine, source=sdist, max_jobs=2, scratch_dir=Path(tempfile.gettempdir())
    )
    assert report.blocked and report.mode == "probed"
    gcc = report.finding("gcc")
    assert gcc is not None and gcc.blocking
    assert gcc.found.startswith("GCC 12.2") and "12.3" in gcc.required
    assert gcc.source.startswith("cmake/cpu_extension.cmake:")
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
    for gate in ("gcc", "cmake"):
        finding = report.finding(gate)
        assert finding is None or not finding.blocking, finding


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
