"""The serving engines, one package each: `builders/engines/<name>/` (vllm, llama_cpp, sglang).

An engine's package holds what Forge knows about it: how its image is planned, the gates its preflight runs, the
checks run in the image just built (`image.py` for an engine whose recipes are kind: native, loaded by name from the
recipe's `engine:`), and how a pool serves it (`serve.py`: its command line, argument checks and readiness probe).
Smoke, sweep and deploy import this package; it imports none of them. SERVING_ENGINES below is the registry of
the engines a pool can run, by the name profiles use (`engine: vllm | llama-cpp | sglang`): adding one is a package with a
`ServingEngine` subclass and a line there; nothing else branches on the kind.
"""

from __future__ import annotations

from builders.config.engines import ServedEngine
from builders.config.models import Recipe
from builders.engines.llama_cpp.serve import LlamaCpp, LlamaCppSettings
from builders.engines.native import NativeEngine
from builders.engines.serving import ModelFormat, PoolCommand, ServerProbe, ServingEngine
from builders.engines.sglang.serve import SGLang, SGLangSettings
from builders.engines.vllm.serve import VLLM
from builders.plan import native_module

ServerKind = ServedEngine
"""What profiles accept as a pool's `engine` (named in builders/config/engines.py); each has an entry below."""

SERVING_ENGINES: dict[str, ServingEngine] = {engine.kind: engine for engine in (VLLM(), LlamaCpp(), SGLang())}
DEFAULT_KIND: ServerKind = "vllm"


def serving_engine(kind: str) -> ServingEngine:
    """The serving engine a profile names (validated there, so an unknown kind is a programming error)."""
    return SERVING_ENGINES[kind]


def native_engine(recipe: Recipe) -> NativeEngine:
    """The engine of a kind=native recipe (builders/engines/<engine>/image.py): its planner, gates and test stage."""
    engine: NativeEngine = native_module(recipe).ENGINE
    return engine


__all__ = [
    "DEFAULT_KIND",
    "SERVING_ENGINES",
    "LlamaCppSettings",
    "ModelFormat",
    "NativeEngine",
    "PoolCommand",
    "SGLangSettings",
    "ServerKind",
    "ServerProbe",
    "ServingEngine",
    "native_engine",
    "serving_engine",
]
