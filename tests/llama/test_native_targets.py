"""The llama-cpp and sglang targets without an engine: their plans, rendered Containerfiles and llama.cpp's preflight
gates (SGLang's CPU gates: tests/sglang/).

The gates are read from sdists made here with the files they cite, so a changed CMake line moves the citation."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest

from builders.engines import make_plan
from builders.errors import ConfigError
from builders.gates.host import read_host_facts
from builders.plan import PlanOptions
from builders.preflight.runner import run_preflight
from builders.project import Project
from builders.render import render

ROOT = Path(__file__).resolve().parents[2]
X86_64_V3 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})


def _sdist(path: Path, top: str, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _llama_sdist(tmp_path: Path, *, cmake_min: str = "3.14", cxx: int = 17, drop_option: str = "") -> Path:
    options = "\n".join(
        f'option({key} "ggml: enable" OFF)'
        for key in ("GGML_NATIVE", "GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2")
        if key != drop_option
    )
    ggml = f"cmake_minimum_required(VERSION 3.14)\n\n{options}\n\nset(CMAKE_C_STANDARD 11)\nset(CMAKE_CXX_STANDARD {cxx})\n"
    return _sdist(
        tmp_path / "llama-cpp-python-0.3.36.tar.gz",
        "llama_cpp_python-0.3.36",
        {
            "vendor/llama.cpp/CMakeLists.txt": f"cmake_minimum_required(VERSION {cmake_min}...3.28) # why\n",
            "vendor/llama.cpp/ggml/CMakeLists.txt": ggml,
        },
    )


def _preflight(project: Project, distro: str, target: str, sdist: Path, flags: frozenset[str]) -> dict[str, object]:
    report = run_preflight(
        project,
        project.distro(distro),
        project.recipe_for(target),
        engine=None,
        source=sdist,
        max_jobs=2,
        scratch_dir=ROOT,
        probe=False,
        run_host_flags=flags,
        run_host_source="test CPU",
        host=read_host_facts(),
    )
    return {"blocked": report.blocked, **{f.gate: f for f in (*report.findings, *report.passed)}}


def test_llama_plan_fixes_the_isa_and_builds_only_llama_server(project: Project) -> None:
    for distro in ("debian-12", "debian-13", "debian-14", "fedora-44", "ubi-9", "ubi-10", "ubuntu-24.04"):
        plan = make_plan(project.distro(distro), project.recipe_for("llama-cpp"), PlanOptions(max_jobs=3))
        text = render(plan, ROOT / "containers")
        assert "-DGGML_NATIVE=OFF" in text and "march=native" not in text
        assert "--target llama-server" in text and "-DLLAMA_BUILD_TESTS=OFF" in text
        assert plan.compile_env["MAX_JOBS"] == "3"
        assert plan.build_args["GGML_AVX2"] == "ON" and plan.build_args["GGML_AVX512"] == "OFF"
        assert "ARG GGML_AVX2=ON" in text
        runtime = text.split(" AS runtime", 1)[1]
        # The runtime installs nothing and copies one binary: no compiler, no CMake reach it.
        assert "install -y" not in runtime and "COPY --from=toolchain /opt/llama/bin/llama-server" in runtime
        assert "USER 1000" in runtime
        assert plan.labels["dev.forge.isa"] == "GGML_NATIVE=OFF; ON: SSE42 AVX AVX2 FMA F16C BMI2"


def test_llama_recipe_rejects_an_isa_key_ggml_does_not_have(project: Project) -> None:
    recipe = project.recipe_for("llama-cpp")
    bad = recipe.model_copy(update={"isa": {**recipe.isa, "GGML_AVX3": "ON"}})
    with pytest.raises(ConfigError, match=r"isa\.GGML_AVX3"):
        make_plan(project.distro("debian-14"), bad, PlanOptions(max_jobs=1))


def test_llama_gates_cite_the_cmake_lines_they_read(project: Project, tmp_path: Path) -> None:
    found = _preflight(project, "debian-14", "llama-cpp", _llama_sdist(tmp_path), X86_64_V3)
    assert found["blocked"] is False
    cmake, compiler, options = found["cmake"], found["compiler"], found["isa-options"]
    assert cmake.source.endswith("vendor/llama.cpp/CMakeLists.txt:1") and cmake.required == "≥ 3.14"  # type: ignore[attr-defined]
    assert compiler.source.endswith("vendor/llama.cpp/ggml/CMakeLists.txt:12")  # type: ignore[attr-defined]
    assert "GGML_AVX2:6" in options.source  # type: ignore[attr-defined]


def test_llama_gates_block_an_old_cmake_a_missing_option_and_a_cpu_without_avx2(
    project: Project, tmp_path: Path
) -> None:
    old = _preflight(project, "debian-12", "llama-cpp", _llama_sdist(tmp_path, cmake_min="3.30"), X86_64_V3)
    assert old["blocked"] is True and old["cmake"].verdict == "block"  # type: ignore[attr-defined]
    (tmp_path / "b").mkdir()
    renamed = _preflight(
        project, "debian-14", "llama-cpp", _llama_sdist(tmp_path / "b", drop_option="GGML_BMI2"), X86_64_V3
    )
    assert "GGML_BMI2" in renamed["isa-options"].found  # type: ignore[attr-defined]
    assert renamed["isa-options"].verdict == "block"  # type: ignore[attr-defined]
    (tmp_path / "c").mkdir()
    sse_only = _preflight(project, "debian-14", "llama-cpp", _llama_sdist(tmp_path / "c"), frozenset({"sse4_2", "avx"}))
    isa = sse_only["isa"]
    assert isa.verdict == "block" and "lacks avx2, bmi2, f16c, fma" in isa.found  # type: ignore[attr-defined]
    assert re.search(r"GGML_AVX2.*OFF", isa.remedy)  # type: ignore[attr-defined]


def test_sglang_renders_a_cpu_image_and_a_gpu_one_beside_vllms(project: Project) -> None:
    cpu = render(
        make_plan(project.distro("debian-14"), project.recipe_for("sglang"), PlanOptions(max_jobs=2)),
        ROOT / "containers",
    )
    assert "torch==2.9.0+cpu" in cpu and "pyproject_cpu.toml" in cpu and "COPY sources/sgl-kernel" in cpu
    gpu_recipe, vllm_gpu = project.recipe_for("sglang-gpu"), project.recipe_for("gpu")
    assert gpu_recipe.distros == vllm_gpu.distros
    plan = make_plan(project.distro("ubuntu-24.04"), gpu_recipe, PlanOptions(max_jobs=2))
    text = render(plan, ROOT / "containers")
    assert "sglang==0.5.10.post1" in text and plan.cuda is not None
    assert f"ARG RUNTIME_IMAGE={plan.cuda.runtime_ref}" in text


def test_a_recipe_whose_engine_is_not_registered_is_refused_naming_the_recipe(project: Project) -> None:
    recipe = project.recipe_for("llama-cpp").model_copy(update={"engine": "tgi"})
    with pytest.raises(ConfigError, match=r"recipes/llama-cpp\.yaml: engine 'tgi' is no serving engine"):
        make_plan(project.distro("debian-14"), recipe, PlanOptions(max_jobs=1))
