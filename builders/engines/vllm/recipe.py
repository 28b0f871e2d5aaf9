"""What a vLLM recipe holds beyond the keys every recipe has (builders/config/models.py): how its compile finds
CMake, and what its runtime stage prepares for `vllm serve`. vLLM is the registry's default engine, so a recipe
that names no `engine:` is one of these."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from builders.config.models import Recipe
from builders.config.types import OneLine


class VllmRecipe(Recipe):
    engine: Literal["vllm"] = Field(default="vllm", description="vLLM (the default when a recipe names none)")
    entrypoint: tuple[OneLine, ...] = Field(default=("vllm", "serve"), description="image entrypoint")
    cmake_from_pip: bool = Field(default=False, description="allow `pip install cmake>=gate` when the distro's is old")
    runtime_jit_compiler: bool = Field(
        default=False,
        description="ship the distro's C++ compiler and Python headers in the runtime: torch.compile (inductor) "
        "compiles CPU kernels when vLLM starts, and dies without g++",
    )
    warm_model_classes: tuple[Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Za-z0-9_]*$")], ...] = Field(
        default=(),
        description="vLLM model classes (e.g. LlamaForCausalLM) whose registry record the runtime stage writes into "
        "the image user's cache: without it every `vllm serve` of such a model inspects the class in a subprocess "
        "that imports torch and the model code, tens of seconds on one core",
    )


def vllm_recipe(recipe: Recipe) -> VllmRecipe:
    """`recipe` as vLLM's model, which the project loads every recipe naming vLLM with."""
    assert isinstance(recipe, VllmRecipe), f"recipes/{recipe.name}.yaml is {recipe.engine}'s, not vLLM's"
    return recipe
