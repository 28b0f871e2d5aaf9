"""The serving engines a pool can run, by the name profiles use (`engine: vllm | llama-cpp`).

Adding one is a module with a `ServingEngine` subclass and a line here; nothing else branches on the kind.
"""

from __future__ import annotations

from typing import Literal

from builders.serving.base import ModelFormat, PoolCommand, ServerProbe, ServingEngine
from builders.serving.llama_cpp import LlamaCpp, LlamaCppSettings
from builders.serving.vllm import VLLM

ServerKind = Literal["vllm", "llama-cpp"]
"""What profiles accept as a pool's `engine`; every value has an entry in SERVING_ENGINES."""

SERVING_ENGINES: dict[str, ServingEngine] = {engine.kind: engine for engine in (VLLM(), LlamaCpp())}
DEFAULT_KIND: ServerKind = "vllm"


def serving_engine(kind: str) -> ServingEngine:
    """The serving engine a profile names (validated there, so an unknown kind is a programming error)."""
    return SERVING_ENGINES[kind]


__all__ = [
    "DEFAULT_KIND",
    "SERVING_ENGINES",
    "LlamaCppSettings",
    "ModelFormat",
    "PoolCommand",
    "ServerKind",
    "ServerProbe",
    "ServingEngine",
    "serving_engine",
]
