"""What a fresh clone holds agrees with itself: `forge lock --check` compares a build's inputs with forge.lock,
so a lock entry that the recipes already contradict would fail that check before any input changed."""

from __future__ import annotations

from pathlib import Path

from builders.project import Project
from builders.repro.lockfile import read_lock

ROOT = Path(__file__).resolve().parents[2]


def test_locked_app_requirements_are_the_recipes() -> None:
    project = Project.load(ROOT)
    lock = read_lock(ROOT / "forge.lock")
    checked = 0
    for key, entry in lock.pairs.items():
        recipe = project.recipe_for(entry.target)
        for reqs in entry.requirements:
            if reqs.name == "app":
                assert reqs.lines == tuple(recipe.app_requirements), key
                checked += 1
    assert checked > 0
