"""Debian 14 stands in for Fedora 44 here (Fedora's registry and mirrors cannot be reached): the two `cpu`
builds may differ only in what is family-specific — package names, paths, the package manager — so whatever the
Debian 14 build proven here needs, the Fedora 44 Containerfile carries too."""

from __future__ import annotations

import pytest

from builders.config.models import Distro
from builders.distros import family_for
from builders.engines import make_plan
from builders.plan import BuildPlan, PlanOptions
from builders.project import Project
from builders.render import render

STAND_IN, TARGET = "debian-14", "fedora-44"


def roles_of(distro: Distro, packages: tuple[str, ...]) -> set[str]:
    """The package roles a list of package names covers; a name no role lists is returned as itself."""
    covered: set[str] = set()
    for package in packages:
        roles = {role for role, names in distro.packages.items() if package in names}
        covered |= roles or {f"unlisted:{package}"}
    return covered


def plan_for(project: Project, name: str, **kw: object) -> BuildPlan:
    options: dict[str, object] = {"max_jobs": 2, "torch_version": "2.14.0", "trust_ca_bundle": True}
    options.update(kw)
    return make_plan(project.distro(name), project.recipe_for("cpu"), PlanOptions(**options))  # type: ignore[arg-type]


def family_neutral(project: Project, plan: BuildPlan) -> str:
    """The rendered Containerfile with every family-specific spelling replaced by what it stands for."""
    distro, family = plan.distro, family_for(plan.distro)
    text = render(plan, project.containers_dir)
    for label, packages in (("build", plan.build_packages), ("runtime", plan.runtime_packages)):
        command = family.install_command(packages)
        assert command in text, f"{distro.name}: the {label} packages are not installed in one step"
        text = text.replace(command, f"<install {label} roles {sorted(roles_of(distro, packages))}>")
    for spelling, meaning in (
        (distro.base.local_tag, "<base>"),
        (distro.base.pinned_ref, "<base reference>"),
        (distro.tcmalloc_path, "<tcmalloc>"),
        (distro.name, "<distro>"),
    ):
        text = text.replace(spelling, meaning)
    return text


@pytest.mark.parametrize("torch_index", ["pytorch-cpu", "pypi"])
def test_fedora_44_carries_whatever_the_debian_14_build_needs(project: Project, torch_index: str) -> None:
    stand_in = family_neutral(project, plan_for(project, STAND_IN, torch_index=torch_index))
    target = family_neutral(project, plan_for(project, TARGET, torch_index=torch_index))
    assert target.splitlines() == stand_in.splitlines()


def test_the_plans_differ_only_in_family_specific_fields(project: Project) -> None:
    d14, f44 = plan_for(project, STAND_IN), plan_for(project, TARGET)
    for field in ("compile_env", "context", "torch", "template", "final_stage", "test_checks", "cmake_from_pip"):
        assert getattr(d14, field) == getattr(f44, field), field
    assert d14.vllm_version == f44.vllm_version
    assert roles_of(d14.distro, d14.build_packages) == roles_of(f44.distro, f44.build_packages)
    assert roles_of(d14.distro, d14.runtime_packages) == roles_of(f44.distro, f44.runtime_packages)
    for role in roles_of(d14.distro, d14.build_packages):
        assert f44.distro.packages.get(role), f"fedora-44 names no package for {role}"  # type: ignore[call-overload]


def test_a_role_fedora_lacks_is_caught(project: Project) -> None:
    """The check above is not vacuous: a Debian-only package in the build shows up as a difference."""
    d14 = plan_for(project, STAND_IN)
    assert "spdlog_headers" in roles_of(d14.distro, d14.build_packages)  # Debian's oneDNN source needs spdlog
    assert roles_of(d14.distro, (*d14.build_packages, "libfoo-dev")) != roles_of(d14.distro, d14.build_packages)
