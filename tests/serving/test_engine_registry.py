"""One registry of serving-engine names (builders/config/engines.py): each name has its package, each package a
name, and the pools' engines are the ones builders.engines can serve."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from builders.config import Project
from builders.config.engines import ENGINE_NAMES, SERVED_ENGINES, engine_package
from builders.engines import SERVING_ENGINES
from builders.errors import ConfigError
from builders.plan import native_module

ENGINES_DIR = Path(__file__).resolve().parents[2] / "builders" / "engines"


def test_every_engine_name_has_a_package_and_every_package_a_name() -> None:
    packages = {p.parent.name for p in ENGINES_DIR.glob("*/__init__.py")}
    assert packages == {engine_package(name).rsplit(".", 1)[1] for name in ENGINE_NAMES}
    for name in ENGINE_NAMES:
        assert importlib.import_module(engine_package(name)).__doc__


def test_the_served_engines_are_the_ones_a_pool_can_run() -> None:
    assert set(SERVED_ENGINES) <= set(ENGINE_NAMES)
    assert sorted(SERVING_ENGINES) == sorted(SERVED_ENGINES)
    assert all(engine.kind == kind for kind, engine in SERVING_ENGINES.items())


def test_each_native_recipe_finds_its_engine_by_its_name() -> None:
    project = Project.load(Path(__file__).resolve().parents[2])
    native = [r for r in project.recipes.values() if r.kind == "native"]
    assert {r.engine for r in native} == {"llama-cpp", "sglang"}
    for recipe in native:
        assert native_module(recipe).__name__ == f"{engine_package(recipe.engine)}.image"
    vllm_recipe = next(r for r in project.recipes.values() if r.engine == "vllm")
    with pytest.raises(ConfigError, match=re.escape("has no module builders.engines.vllm.image")):
        native_module(vllm_recipe)
