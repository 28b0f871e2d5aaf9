"""The project's data: every distro and recipe, loaded once and cross-checked. A recipe is validated by its serving
engine's model (the registry's, builders/engines/), so the project sits above the engines."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from pydantic import TypeAdapter, ValidationError

from builders.config.by_engine import ByEngine
from builders.config.loading import load_model
from builders.config.models import Distro, Recipe
from builders.config.types import Name
from builders.engines import ENGINES
from builders.errors import ConfigError, UsageError


def find_root(start: Path | None = None) -> Path:
    """The nearest folder holding distros/ and recipes/; FORGE_ROOT wins."""
    env = os.environ.get("FORGE_ROOT")
    if env:
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "distros").is_dir() and (folder / "recipes").is_dir():
            return folder
    package_root = Path(__file__).resolve().parents[2]
    if (package_root / "distros").is_dir():
        return package_root
    raise UsageError(
        "no distros/ and recipes/ found here or above", hint="run inside a Forge checkout or set FORGE_ROOT"
    )


def _suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.4)
    return f" — did you mean {close[0]!r}?" if close else ""


M = TypeVar("M", Distro, Recipe)


_NAME = TypeAdapter(Name)


def file_name(path: Path) -> str:
    """The name a file's stem gives (a distro, a recipe, a profile): it becomes part of image tags, report folders
    and session names, so it is held to the Name type before anything reads the file."""
    try:
        return _NAME.validate_python(path.stem)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{path}: the file name {path.stem!r} is no name: {reason}", hint="rename the file") from None


def _load_dir(folder: Path, model: type[M] | ByEngine[M]) -> dict[str, M]:
    items: dict[str, M] = {}
    for path in sorted(folder.glob("*.yaml")):
        file_name(path)
        item = load_model(model, path, defaults={"name": path.stem})
        if item.name != path.stem:
            raise ConfigError(f"{path}: name {item.name!r} differs from the file name {path.stem!r}")
        items[item.name] = item
    if not items:
        raise ConfigError(f"{folder}: no *.yaml files")
    return items


@dataclass(frozen=True)
class Project:
    root: Path

    @classmethod
    def load(cls, root: str | Path | None = None) -> Project:
        if not root:
            return cls(find_root())
        path = Path(root).resolve()
        # Said of --root itself: "no *.yaml files in /nonexistent/distros" hid that the folder was not there.
        if not path.exists():
            raise UsageError(
                f"--root {root}: no such folder", hint="name a Forge checkout (it holds distros/, recipes/)"
            )
        if not path.is_dir():
            raise UsageError(f"--root {root}: not a folder", hint="name a Forge checkout (it holds distros/, recipes/)")
        missing = [name for name in ("distros", "recipes") if not (path / name).is_dir()]
        if missing:
            raise UsageError(
                f"--root {root}: no {' and no '.join(f'{m}/' for m in missing)} folder in it",
                hint="name a Forge checkout, or a copy of its distros/, recipes/ and containers/",
            )
        return cls(path)

    @property
    def containers_dir(self) -> Path:
        return self.root / "containers"

    @cached_property
    def distros(self) -> dict[str, Distro]:
        return _load_dir(self.root / "distros", Distro)

    @cached_property
    def recipes(self) -> dict[str, Recipe]:
        # Each recipe by its serving engine's model: the common keys, and that engine's own.
        recipes = _load_dir(self.root / "recipes", ENGINES.recipe_models())
        targets: dict[str, str] = {}
        for recipe in recipes.values():
            if recipe.target in targets:
                raise ConfigError(
                    f"recipes/{recipe.name}.yaml: target {recipe.target!r} is also the target of "
                    f"recipes/{targets[recipe.target]}.yaml",
                    hint="each target is built by exactly one recipe",
                )
            targets[recipe.target] = recipe.name
            if recipe.distros != "all":
                for name in recipe.distros:
                    if name not in self.distros:
                        raise ConfigError(
                            f"recipes/{recipe.name}.yaml: distros: unknown distro {name!r}"
                            + _suggest(name, list(self.distros))
                        )
            if not (self.containers_dir / recipe.template).is_file():
                raise ConfigError(f"recipes/{recipe.name}.yaml: template: no containers/{recipe.template}")
        return recipes

    @property
    def targets(self) -> dict[str, Recipe]:
        return {r.target: r for r in self.recipes.values()}

    def distro(self, name: str) -> Distro:
        """A distro by release name, or by family name for the family's default release."""
        if name in self.distros:
            return self.distros[name]
        defaults = [d for d in self.distros.values() if d.family == name and d.default_for_family]
        if defaults:
            return defaults[0]
        raise UsageError(
            f"unknown distro {name!r}" + _suggest(name, [*self.distros, *self.families]),
            hint=f"known distros: {', '.join(self.distros)}",
        )

    @property
    def families(self) -> dict[str, Distro]:
        """Each family's default release, by family name."""
        return {d.family: d for d in self.distros.values() if d.default_for_family}

    def recipe_for(self, target: str) -> Recipe:
        if target in self.targets:
            return self.targets[target]
        if target in self.recipes:
            return self.recipes[target]
        raise UsageError(
            f"unknown target {target!r}" + _suggest(target, list(self.targets)),
            hint=f"known targets: {', '.join(self.targets)}",
        )

    def pairs(self) -> list[tuple[Distro, Recipe]]:
        """Every buildable distro × target, in a stable order: the one list sessions and CI come from."""
        return [(d, r) for d in self.distros.values() for r in self.recipes.values() if r.supports(d.name)]
