"""YAML → schema model, with errors that name the file, the key path and the closest valid key."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from builders.errors import ConfigError

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
            lines.append(f"{source}: {_dotted(loc)}: {err['msg']}")
    return ConfigError("\n  ".join(lines), hint=hint)


def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such file") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


def load_model(model: type[M], path: Path, *, defaults: dict[str, Any] | None = None) -> M:
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, found {type(data).__name__}")
    try:
        return model.model_validate({**(defaults or {}), **data})
    except ValidationError as exc:
        raise validation_error_to_config_error(exc, model, str(path)) from None
