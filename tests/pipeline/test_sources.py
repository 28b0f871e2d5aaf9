"""The source cache: a source that is missing is fetched where Forge knows how, else named with both ways out."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.build import BuildOptions, _fetched_source
from builders.config import Project
from builders.config.models import FetchedSource
from builders.engine import Engine
from builders.errors import SourceUnavailable
from builders.sources import manylinux_platforms, resolve_fetched


def test_missing_source_without_a_provider_names_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path))
    source = FetchedSource(name="acl", cmake_var="ACL_ROOT_DIR", pinned_in="cmake/cpu_extension.cmake")
    with pytest.raises(SourceUnavailable) as err:
        resolve_fetched(source, tmp_path, {})
    text = err.value.render()
    assert "'acl'" in text and "cmake/cpu_extension.cmake" in text
    assert "forge fetch" in text and "--source acl=PATH" in text


def test_override_must_be_a_directory(tmp_path: Path) -> None:
    source = FetchedSource(name="onednn", cmake_var="X", pinned_in="cmake/cpu_extension.cmake")
    with pytest.raises(SourceUnavailable, match="not a directory"):
        resolve_fetched(source, tmp_path, {"onednn": tmp_path / "missing"})
    assert resolve_fetched(source, tmp_path, {"onednn": tmp_path}).origin == f"override: {tmp_path}"


def test_manylinux_tags_follow_the_distros_glibc() -> None:
    tags = manylinux_platforms("2.36", "x86_64")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_37_x86_64" not in tags


@pytest.mark.engine
def test_missing_onednn_is_fetched_from_debians_source_package(
    project: Project, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "cache"))
    fetched = project.recipe_for("cpu").fetched_sources[0]
    lines: list[str] = []
    got = _fetched_source(project, project.distro("debian-12"), fetched, engine, BuildOptions(), lines.append)
    assert got.origin.startswith("debian-source: onednn 3.")
    assert (got.path / "include" / "oneapi" / "dnnl" / "dnnl.hpp").exists()
    assert any("not in the source cache" in line for line in lines)
    again = _fetched_source(project, project.distro("debian-12"), fetched, engine, BuildOptions(), lines.append)
    assert again.path == got.path  # cached now: no second fetch
