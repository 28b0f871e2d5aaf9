"""A model chosen by a mapping's `engine:` key: how the common models (a recipe, a pool) hold what every serving
engine shares while each engine's package owns a subclass with its own keys.

The choice is data handed in by the caller, never a list kept here: the serving engines' registry
(builders/engines/__init__.py) makes a `ByEngine` of its engines' models, and the loaders pass it down (a
profile's pools through pydantic's validation context, under POOL_MODELS).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

POOL_MODELS = "pool_models"
"""The validation-context key under which a profile's loader hands in its pools' `ByEngine`."""


@dataclass(frozen=True)
class ByEngine(Generic[M]):
    """Each engine's model by its name, the one a mapping without `engine:` gets, and how messages name each."""

    models: Mapping[str, type[M]]
    default: str
    titles: Mapping[str, str]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.models)

    def name_of(self, data: Any) -> str:
        """The engine a mapping names (the default where it names none)."""
        name = data.get("engine", self.default) if isinstance(data, Mapping) else getattr(data, "engine", None)
        return name if isinstance(name, str) else self.default

    def pick(self, data: Any) -> type[M] | None:
        """The model of the engine `data` names; None for a name no engine has (the common model then says so)."""
        return self.models.get(self.name_of(data))

    def owner(self, key: str, *, besides: str, common: type[BaseModel]) -> str | None:
        """The engine other than `besides` whose own model has `key` (not a key every engine's has)."""
        own = self.models.get(besides)
        for name, model in self.models.items():
            theirs = name != besides and key in model.model_fields and key not in common.model_fields
            if theirs and (own is None or key not in own.model_fields):
                return name
        return None

    def without_unset_foreign(self, data: Mapping[str, Any], *, common: type[BaseModel]) -> dict[str, Any]:
        """`data` less the keys of another engine's model written out at their default: they set nothing (a
        dumped profile spells every field of its own model; one from an older Forge spelt every engine's)."""
        name = self.name_of(data)
        out = dict(data)
        for key, value in data.items():
            other = self.owner(key, besides=name, common=common)
            if other is not None:
                field = self.models[other].model_fields[key]
                if value == field.get_default(call_default_factory=True):
                    del out[key]
        return out
