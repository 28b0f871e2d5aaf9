"""Target.resolve: what a distro × recipe × --gpu-mode means, decided once for preflight, build and CI."""

from __future__ import annotations

import ast
from pathlib import Path

from builders.project import Project
from builders.target import Target


def test_each_kind_of_target(project: Project) -> None:
    d13 = project.distro("debian-13")
    cpu = Target.resolve(d13, project.recipe_for("cpu"))
    assert cpu.compiles and cpu.cpu and cpu.pinned_source and cpu.installs_torch and not cpu.cuda
    wheel = Target.resolve(d13, project.recipe_for("cpu-wheel"))
    assert not wheel.compiles and wheel.cpu and wheel.installs_torch
    router = Target.resolve(d13, project.recipe_for("router"))
    assert not (router.compiles or router.pinned_source or router.installs_torch or router.cpu)
    llama = Target.resolve(project.distro("debian-14"), project.recipe_for("llama-cpp"))
    # Another engine's pinned archive is an input too, though the vLLM-shaped `compiles` says no.
    assert llama.pinned_source and llama.cpu and not (llama.compiles or llama.installs_torch or llama.from_sdist)


def test_gpu_mode_decides_whether_a_gpu_target_compiles(project: Project) -> None:
    f44, gpu = project.distro("fedora-44"), project.recipe_for("gpu")
    assert gpu.cuda is not None
    default = Target.resolve(f44, gpu)
    assert default.cuda and default.gpu_mode == gpu.cuda.mode
    source = Target.resolve(f44, gpu, gpu_mode="source")
    wheel = Target.resolve(f44, gpu, gpu_mode="wheel")
    assert source.compiles and not source.gpu_wheel
    assert wheel.gpu_wheel and not wheel.compiles and wheel.installs_torch
    # No cuda section in the distro file: no mode to speak of (preflight blocks on that instead).
    bare = Target.resolve(project.distro("ubuntu-22.04"), gpu, gpu_mode="wheel")
    assert bare.gpu_mode is None and bare.cuda


def test_a_lock_reads_the_sdist_even_for_a_gpu_wheel_build(project: Project) -> None:
    f44, gpu = project.distro("fedora-44"), project.recipe_for("gpu")
    wheel = Target.resolve(f44, gpu, gpu_mode="wheel")
    assert wheel.from_sdist and not wheel.compiles and (wheel.kind, wheel.device) == ("source", "cuda")
    d13 = project.distro("debian-13")
    assert not Target.resolve(d13, project.recipe_for("cpu-wheel")).from_sdist
    assert Target.resolve(d13, project.recipe_for("router")).python_app


# Which recipe a module works on is decided in builders/target.py; what may stay outside it: the Recipe model's
# own consistency validators (three today). Raising this number needs a reason in the commit that does it.
MAX_KIND_DEVICE_TESTS_OUTSIDE_TARGET = 5
PACKAGE = Path(__file__).resolve().parents[2] / "builders"


def kind_device_reads(source: str) -> list[int]:
    """Line numbers where `.kind`/`.device` is read off a recipe: a name ending in `recipe` (`recipe`,
    `ctx.recipe`, `gpu_recipe`), or `self` inside `class Recipe`. Other `.kind`s (tar entries, pins, metrics)
    are not the recipe's and do not count."""
    lines: list[int] = []

    def walk(node: ast.AST, in_recipe_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_recipe_class or (isinstance(child, ast.ClassDef) and child.name == "Recipe")
            if isinstance(child, ast.Attribute) and child.attr in {"kind", "device"}:
                owner = child.value
                name = (
                    owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
                )
                if name.lower().endswith("recipe") or (name == "self" and inside):
                    lines.append(child.lineno)
            walk(child, inside)

    walk(ast.parse(source), False)
    return lines


def test_the_counter_sees_recipe_reads_and_nothing_else() -> None:
    source = (
        "if recipe.kind == 'source': pass\n"
        "x = ctx.recipe.device\n"
        "y = entry.kind, pin.device, self.kind\n"
        "class Recipe:\n"
        "    def check(self):\n"
        "        return self.device == 'cuda'\n"
    )
    assert kind_device_reads(source) == [1, 2, 6]


def test_kind_and_device_are_decided_in_the_target_module() -> None:
    found = {
        f"{path.relative_to(PACKAGE.parent)}:{line}": line
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "target.py"
        for line in kind_device_reads(path.read_text())
    }
    assert len(found) <= MAX_KIND_DEVICE_TESTS_OUTSIDE_TARGET, (
        f"{len(found)} reads of recipe.kind/.device outside builders/target.py: {sorted(found)}; "
        "add a Target property named for the question instead"
    )
