"""The source cache: a source that is missing is fetched where Forge knows how, else named with both ways out."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.build import BuildOptions, _fetched_source
from builders.config.models import FetchedSource, Recipe
from builders.container import Engine
from builders.errors import SourceUnavailable
from builders.project import Project
from builders.sources import manylinux_platforms, resolve_fetched

ROOT = Path(__file__).resolve().parents[2]


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


def _wheel(folder: Path, name: str, version: str, tag: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal valid wheel: pip reads its METADATA to check that it is what its file name says."""
    import zipfile

    path = folder / f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    deps = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{deps}")
        zf.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def _simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index on disk, as pip reads PyTorch's."""
    project = root / "simple" / "torch"
    project.mkdir(parents=True)
    links = "".join(f'<a href="{w.resolve().as_uri()}">{w.name}</a>\n' for w in wheels)
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return (root / "simple").as_uri()


def test_the_torch_pin_comes_from_the_recipes_torch_index_first(tmp_path: Path) -> None:
    from builders.platforms import PLATFORMS, for_platform
    from builders.sources import _torch_first, pip_download_command

    project = Project.load(ROOT)
    distro = for_platform(project.distro("debian-12"), PLATFORMS["linux/arm64"])
    built = tmp_path / "built"
    built.mkdir()
    cpu = _wheel(built, "torch", "2.13.0+cpu", "cp311-cp311-manylinux_2_28_aarch64")
    _wheel(built, "torch", "2.13.0+cpu", "cp311-cp311-manylinux_2_28_x86_64")  # another arch's: not taken
    recipe = project.recipe_for("cpu-wheel")
    assert recipe.wheelhouse is not None and recipe.wheelhouse.torch_index == "pytorch-cpu"
    recipe = recipe.model_copy(
        update={"wheelhouse": recipe.wheelhouse.model_copy(update={"torch_index": _simple_index(tmp_path, [cpu])})}
    )
    dest = tmp_path / "wheelhouse"
    dest.mkdir()
    line = _torch_first(recipe, pip_download_command(distro, recipe, dest), dest)
    assert [w.name for w in dest.iterdir()] == [cpu.name]
    assert line.startswith(f"torch: {cpu.name} (from file://")


def test_an_index_without_the_pin_leaves_the_wheelhouse_to_pypi_and_says_so(tmp_path: Path) -> None:
    from builders.platforms import PLATFORMS, for_platform
    from builders.sources import _torch_first, pip_download_command

    project = Project.load(ROOT)
    distro = for_platform(project.distro("debian-12"), PLATFORMS["linux/arm64"])
    recipe = project.recipe_for("cpu-wheel")
    assert recipe.wheelhouse is not None
    empty = _simple_index(tmp_path, [])
    recipe = recipe.model_copy(update={"wheelhouse": recipe.wheelhouse.model_copy(update={"torch_index": empty})})
    dest = tmp_path / "wheelhouse"
    dest.mkdir()
    line = _torch_first(recipe, pip_download_command(distro, recipe, dest), dest)
    assert list(dest.iterdir()) == []
    assert line.startswith(f"torch: torch==2.13.0 not fetched from {empty} (") and "cpu-kernels" in line
    assert recipe.wheelhouse is not None
    no_index = recipe.model_copy(update={"wheelhouse": recipe.wheelhouse.model_copy(update={"torch_index": None})})
    assert _torch_first(no_index, pip_download_command(distro, no_index, dest), dest) == ""


def _sentry_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """pip's index (PIP_INDEX_URL) on disk, publishing sentry-sdk 2.76.0 alone: (the wheel, its index page)."""
    published = tmp_path / "published"
    published.mkdir()
    wheel = _wheel(published, "sentry_sdk", "2.76.0", "py3-none-any")
    index = tmp_path / "simple" / "sentry-sdk"
    index.mkdir(parents=True)
    page = index / "index.html"
    page.write_text(f'<html><body><a href="{wheel.resolve().as_uri()}">{wheel.name}</a></body></html>')
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "simple").as_uri())
    return wheel, page


def _asking(project: Project, *requirements: str) -> Recipe:
    """The cpu-wheel recipe asking for `requirements` alone, from pip's index only."""
    recipe = project.recipe_for("cpu-wheel")
    assert recipe.wheelhouse is not None
    wheelhouse = recipe.wheelhouse.model_copy(
        update={"requirements": list(requirements), "torch_index": None, "find_links": []}
    )
    return recipe.model_copy(update={"wheelhouse": wheelhouse})


def test_a_refetch_drops_the_release_it_resolved_past(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheelhouse fetched last week holds sentry-sdk 2.75.0; PyPI has 2.76.0 now. The image installs the whole
    folder, so both side by side failed the build ('Cannot install sentry-sdk 2.75.0 and sentry-sdk 2.76.0'). Real
    pip, against an index on disk that has only the newer release."""
    from builders.sources import _fetch_wheelhouse

    project = Project.load(ROOT)
    distro = project.distro("debian-12")
    newer, _page = _sentry_index(tmp_path, monkeypatch)
    dest = tmp_path / "wheelhouse"
    dest.mkdir()
    stale = _wheel(dest, "sentry_sdk", "2.75.0", "py3-none-any")
    unrelated = _wheel(dest, "leftover", "1.0", "py3-none-any")  # pip says nothing of it: not Forge's to judge
    recipe = _asking(project, "sentry-sdk")
    assert _fetch_wheelhouse(recipe, distro, dest, None) == dest
    assert sorted(w.name for w in dest.iterdir()) == sorted([newer.name, unrelated.name])
    assert not stale.exists()
    # A second fetch finds the wheel already there, names it so, and keeps it.
    _fetch_wheelhouse(recipe, distro, dest, None)
    assert sorted(w.name for w in dest.iterdir()) == sorted([newer.name, unrelated.name])


def test_a_set_resolved_once_is_not_resolved_again_in_the_same_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI's engine tests asked for the cpu-wheel set three times, a minute of pip reading PyPI each time with every
    wheel already there. The second ask must not reach the index (gone here), unless a wheel it named is missing."""
    from builders import sources

    monkeypatch.setattr(sources, "_RESOLVED", {})
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "cache"))
    project = Project.load(ROOT)
    distro = project.distro("debian-12")
    wheel, page = _sentry_index(tmp_path, monkeypatch)
    recipe = _asking(project, "sentry-sdk")
    dest = sources.fetch_wheelhouse(recipe, distro, ROOT)
    assert [w.name for w in dest.glob("*.whl")] == [wheel.name]
    page.unlink()  # the index has nothing now: only a memory of the set can answer
    said: list[str] = []
    assert sources.fetch_wheelhouse(recipe, distro, ROOT, say=said.append) == dest
    assert said and "resolved earlier in this process" in said[0]
    # Another set is its own resolution: nothing, in the index or the folder, satisfies this one.
    with pytest.raises(SourceUnavailable):
        sources.fetch_wheelhouse(_asking(project, "sentry-sdk>=2.77"), distro, ROOT)
    # A wheel of the set gone from the folder: resolved again, which the empty index now refuses.
    (dest / wheel.name).unlink()
    with pytest.raises(SourceUnavailable):
        sources.fetch_wheelhouse(recipe, distro, ROOT)


def test_an_excluded_dependency_without_a_wheel_is_left_out_of_the_resolution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sglang 0.5.23 needs outlines, whose outlines_core pin has no CPython 3.13 wheel: pip cannot resolve the set
    for Debian 13, and the recipe excludes outlines. The fetch resolves the rest without it; without the exclude it
    fails, naming what pip could not find. Real pip, against an index on disk."""
    from builders.sources import _fetch_wheelhouse

    published = tmp_path / "published"
    published.mkdir()
    wheels = {
        "app": _wheel(published, "app", "1.0", "py3-none-any", requires=("good==1.0", "bad==1.0")),
        "good": _wheel(published, "good", "1.0", "py3-none-any"),
        "bad": _wheel(published, "bad", "1.0", "py3-none-any", requires=("missing==9.9",)),
    }
    for name, wheel in wheels.items():
        (tmp_path / "simple" / name).mkdir(parents=True)
        page = f'<html><body><a href="{wheel.resolve().as_uri()}">{wheel.name}</a></body></html>'
        (tmp_path / "simple" / name / "index.html").write_text(page)
    (tmp_path / "simple" / "missing").mkdir()
    (tmp_path / "simple" / "missing" / "index.html").write_text("<html><body></body></html>")
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "simple").as_uri())
    project = Project.load(ROOT)
    distro = project.distro("debian-13")
    recipe = _asking(project, "app==1.0")
    assert recipe.wheelhouse is not None
    with pytest.raises(SourceUnavailable) as refused:
        _fetch_wheelhouse(
            recipe.model_copy(update={"wheelhouse": recipe.wheelhouse.model_copy(update={"exclude": []})}),
            distro,
            _empty(tmp_path / "a"),
            None,
        )
    assert "missing" in refused.value.message
    excluding = recipe.model_copy(update={"wheelhouse": recipe.wheelhouse.model_copy(update={"exclude": ["bad"]})})
    dest = _fetch_wheelhouse(excluding, distro, _empty(tmp_path / "b"), None)
    assert sorted(w.name for w in dest.iterdir()) == sorted([wheels["app"].name, wheels["good"].name])


def _empty(folder: Path) -> Path:
    folder.mkdir()
    return folder
