"""The registry of serving engines: one object holding each engine's `ServingEngine`, from which every list of
engine names is derived (what a recipe's and a pool's `engine:` accept, the smoke and sweep options, the
schemas). builders/engines/__init__.py makes the one registry Forge uses, one line per engine; the core imports
it and asks it, and never names an engine itself."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from contextlib import contextmanager

from builders.config.by_engine import ByEngine
from builders.config.models import Recipe
from builders.config.profile import PoolSettings
from builders.engines.serving import ServingEngine
from builders.errors import ConfigError


class Registry:
    """The engines by name, the first the default: what a recipe or pool that names no engine gets."""

    def __init__(self, default: ServingEngine, *others: ServingEngine) -> None:
        self._engines: dict[str, ServingEngine] = {}
        for engine in (default, *others):
            self._add(engine)
        self.default = default

    def _add(self, engine: ServingEngine) -> None:
        if engine.name in self._engines:
            raise ValueError(f"two serving engines are named {engine.name!r}")
        self._engines[engine.name] = engine

    def __iter__(self) -> Iterator[ServingEngine]:
        return iter(list(self._engines.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._engines

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._engines)

    @property
    def served(self) -> tuple[ServingEngine, ...]:
        """The engines a pool can run (those with a pool settings model)."""
        return tuple(e for e in self._engines.values() if e.serves)

    def get(self, name: str) -> ServingEngine:
        """The engine `name` (validated where it was read, so an unknown name here is a defect or a stale file)."""
        try:
            return self._engines[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._engines, n=1, cutoff=0.5)
            raise ConfigError(
                f"no serving engine {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                hint=f"serving engines: {', '.join(self._engines)}",
            ) from None

    def of(self, recipe: Recipe) -> ServingEngine:
        """The engine that plans, preflights and tests `recipe`'s image."""
        if recipe.engine not in self._engines:
            raise ConfigError(
                f"recipes/{recipe.name}.yaml: engine {recipe.engine!r} is no serving engine Forge has",
                hint=f"serving engines: {', '.join(self._engines)} (each a package of builders/engines/)",
            )
        return self._engines[recipe.engine]

    def pool_models(self) -> ByEngine[PoolSettings]:
        """The pool settings model of each engine a pool can run, for a profile's loader to validate pools by."""
        served = self.served
        return ByEngine(
            models={e.name: e.pool_model for e in served if e.pool_model is not None},
            default=self.default.name,
            titles={e.name: e.title for e in served},
        )

    def recipe_models(self) -> ByEngine[Recipe]:
        """The recipe model of each engine, for the project's loader to validate recipes by."""
        return ByEngine(
            models={e.name: e.recipe_model for e in self},
            default=self.default.name,
            titles={e.name: e.title for e in self},
        )

    @contextmanager
    def added(self, engine: ServingEngine) -> Iterator[ServingEngine]:
        """`engine` registered for the duration of the block: how a test adds an engine of its own package
        through the registry alone, the way a new engine's registry line would."""
        self._add(engine)
        try:
            yield engine
        finally:
            del self._engines[engine.name]
