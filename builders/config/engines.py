"""The serving engines' names: the one registry that recipes (`engine:`) and profiles (a pool's `engine:`) take
theirs from.

Each name has a package, builders/engines/<name, `-` as `_`>/, that knows the engine (tests/serving checks both
ways). The names live here, below the engines, because the recipe model in config/models.py validates them.
"""

from __future__ import annotations

from typing import Literal, get_args

EngineName = Literal["vllm", "llama-cpp", "sglang"]
"""Every serving engine: what a recipe's `engine:` accepts."""

ServedEngine = Literal["vllm", "llama-cpp", "sglang"]
"""The engines a pool can run: what a profile's `engine:` accepts; builders/engines SERVING_ENGINES has each."""

ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)
SERVED_ENGINES: tuple[str, ...] = get_args(ServedEngine)


def engine_package(name: str) -> str:
    """The package that knows an engine (llama-cpp → builders.engines.llama_cpp)."""
    return f"builders.engines.{name.replace('-', '_')}"
