"""YAML → schema model, with errors that name the file, the key path and the closest valid key."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from builders.config.by_engine import ByEngine
from builders.errors import ConfigError, UsageError
from builders.input_files import read_small_text

M = TypeVar("M", bound=BaseModel)


def _model_at(model: type[BaseModel], path: tuple[int | str, ...]) -> type[BaseModel] | None:
    """Walk a model's fields along a key path, to find which keys were valid where an unknown one appeared."""
    current: Any = model
    for part in path:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        current = _unwrap(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    args = getattr(annotation, "__args__", None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in args or ():
        found = _unwrap(arg)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
    return annotation


def _dotted(path: tuple[int | str, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def validation_error_to_config_error(exc: ValidationError, model: type[BaseModel], source: str) -> ConfigError:
    lines = []
    hint = None
    for err in exc.errors():
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            valid = sorted(parent.model_fields) if parent else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            suggestion = f" — did you mean {close[0]!r}?" if close else ""
            lines.append(f"{source}: unknown key {_dotted(loc)!r}{suggestion}")
            hint = f"valid keys there: {', '.join(valid)}" if valid else hint
        else:
            # A type of builders/config/types.py says what is wrong in its own words; pydantic's "Value error, "
            # before them says nothing more.
            lines.append(f"{source}: {_dotted(loc)}: {err['msg'].removeprefix('Value error, ')}")
    return ConfigError("\n  ".join(lines), hint=hint)


class DuplicateKey(yaml.MarkedYAMLError):
    """A mapping names one key twice: YAML leaves that undefined and PyYAML silently keeps the last value, so a
    second `family:` pasted at the end of a file would win over the first without a word."""


# libyaml's parser where PyYAML was built with it: every command loads every distro and recipe, and the pure-Python
# parser spent about 70 ms on each file here. The constructors (what becomes of the nodes) are the same Python ones.
_SafeBase: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeBase):  # type: ignore[valid-type,misc]
    """SafeLoader that refuses a key given twice in one mapping (`<<` merges may still override)."""


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the constructor below reports it
            continue
        if first is not None:
            raise DuplicateKey(
                "while reading a mapping",
                node.start_mark,
                f"key {key!r} is given twice (first on line {first.start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def parse_yaml(text: str) -> Any:
    """YAML text → data, refusing a key given twice in a mapping (DuplicateKey, a yaml.YAMLError)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects


YAML_LIMIT_BYTES = 16 * 2**20
"""The largest distro, recipe or profile file read (Forge's own are a few kB)."""


def load_yaml(path: Path) -> Any:
    # A FIFO in distros/ would block the glob's load and /dev/zero would never end: refused before any read.
    try:
        text = read_small_text(path, limit=YAML_LIMIT_BYTES, what="YAML file", hint="save the file as UTF-8 text")
    except UsageError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from None
    try:
        return parse_yaml(text)
    except DuplicateKey as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else "?"
        raise ConfigError(f"{path}: line {line}: {exc.problem}", hint="keep one of the two") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


def load_model(model: type[M] | ByEngine[M], path: Path, *, defaults: Mapping[str, object] | None = None) -> M:
    """A YAML file as `model`; given each serving engine's model instead, as the one its `engine:` names."""
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, found {type(data).__name__}")
    if isinstance(model, ByEngine):
        chosen = model.pick(data)
        if chosen is None:
            names = [repr(n) for n in model.names]
            either = " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"
            raise ConfigError(f"{path}: engine: Input should be {either}", hint="name a serving engine Forge has")
        model = chosen
    try:
        return model.model_validate({**(defaults or {}), **data})
    except ValidationError as exc:
        raise validation_error_to_config_error(exc, model, str(path)) from None
