"""Inference engines other than vLLM, one module each (issue 25).

vLLM's build is the one the rest of `builders/` was written around. Another engine is a module here named after
its recipe's `engine:` (llama-cpp → builders/inference/llama_cpp.py) exporting ENGINE, a NativeEngine: it plans,
preflights and tests its own images, so plan, preflight and the build's phases ask `native_engine(recipe)` and
never which engine it is.
"""

from __future__ import annotations

import importlib

from builders.config.models import Recipe
from builders.errors import ConfigError
from builders.inference.base import NativeEngine


def native_engine(recipe: Recipe) -> NativeEngine:
    module_name = f"builders.inference.{recipe.engine.replace('-', '_')}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"recipes/{recipe.name}.yaml: engine {recipe.engine!r} with kind native has no module {module_name}",
            hint="kind: native is for engines with a module in builders/inference; vLLM recipes use source or wheel",
        ) from exc
    engine: NativeEngine = module.ENGINE
    return engine
