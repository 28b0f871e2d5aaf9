"""Inference engines other than vLLM, one module each (issue 25).

vLLM's build is the one the rest of `builders/` was written around. Another engine is a module here named after
its recipe's `engine:` (llama-cpp → builders/inference/llama_cpp.py) exporting ENGINE, a NativeEngine: it plans,
preflights and tests its own images, so plan, preflight and the build's phases ask `native_engine(recipe)` and
never which engine it is.
"""

from __future__ import annotations

from builders.config.models import Recipe
from builders.inference.base import NativeEngine
from builders.plan import native_module


def native_engine(recipe: Recipe) -> NativeEngine:
    """The engine module of a kind=native recipe: its planner, gates and test stage."""
    engine: NativeEngine = native_module(recipe).ENGINE
    return engine
