"""One registry of serving engines (builders/engines/__init__.py): each engine package has its entry and each
entry its package, every list of names comes from it, and each recipe and pool is validated by its engine's own
model."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from builders.config.models import Recipe
from builders.config.profile import PoolSettings
from builders.engines import ENGINES
from builders.errors import ConfigError
from builders.project import Project

ROOT = Path(__file__).resolve().parents[2]
ENGINES_DIR = ROOT / "builders" / "engines"


def test_every_engine_package_has_one_entry_and_every_entry_a_package() -> None:
    packages = {p.parent.name for p in ENGINES_DIR.glob("*/__init__.py")}
    homes = {type(engine).__module__.split(".")[2] for engine in ENGINES}
    assert homes == packages
    assert [e.name for e in ENGINES] == list(ENGINES.names) and len(set(ENGINES.names)) == len(packages)
    assert ENGINES.default.name == "vllm"


def test_each_engine_model_names_its_own_engine() -> None:
    for engine in ENGINES:
        assert issubclass(engine.recipe_model, Recipe)
        assert typing.get_args(engine.recipe_model.model_fields["engine"].annotation) == (engine.name,)
        if engine.pool_model is not None:
            assert issubclass(engine.pool_model, PoolSettings)
            assert typing.get_args(engine.pool_model.model_fields["engine"].annotation) == (engine.name,)
    assert {e.name for e in ENGINES.served} == {"vllm", "llama-cpp", "sglang"}


def test_each_recipe_is_loaded_by_the_model_of_the_engine_it_names(project: Project) -> None:
    for recipe in project.recipes.values():
        assert type(recipe) is ENGINES.of(recipe).recipe_model, recipe.name
    assert {r.engine for r in project.recipes.values() if r.kind == "native"} == {"llama-cpp", "sglang"}
    assert project.recipe_for("router").engine == "vllm"  # names none: the default engine's


def test_a_recipe_naming_no_known_engine_or_another_engines_key_is_refused(project_copy: Path) -> None:
    recipe = project_copy / "recipes" / "llama-cpp.yaml"
    text = recipe.read_text()
    recipe.write_text(text.replace("engine: llama-cpp", "engine: llama-ccp"))
    with pytest.raises(ConfigError, match="engine: Input should be 'vllm', 'llama-cpp' or 'sglang'"):
        _ = Project.load(project_copy).recipes
    # vLLM's own key is no key of llama.cpp's recipes.
    recipe.write_text(text + "warm_model_classes: [LlamaForCausalLM]\n")
    with pytest.raises(ConfigError, match="unknown key 'warm_model_classes'"):
        _ = Project.load(project_copy).recipes


def test_an_unknown_engine_is_named_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        ENGINES.get("llama")
    assert "did you mean 'llama-cpp'?" in err.value.message and "vllm, llama-cpp, sglang" in (err.value.hint or "")


def test_the_registry_refuses_a_second_engine_of_a_name_and_forgets_an_added_one() -> None:
    with pytest.raises(ValueError, match="two serving engines are named 'vllm'"), ENGINES.added(ENGINES.default):
        pass
    assert ENGINES.names == ("vllm", "llama-cpp", "sglang")
