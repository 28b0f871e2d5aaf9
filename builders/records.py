"""What every run report shares: a pydantic model that says what each field holds, validates when it is read back,
and is written staged beside its final name.

A report is JSON other tools read (CI jobs, `forge push`, scripts), so its keys and value shapes are part of
Forge's interface: a model keeps them as they were. A field made with `absent(...)` is left out of the JSON while
it is None, as the key was never written before the run got that far; every other None is written as null.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer

from builders.errors import ConfigError

# The key a field made with `absent()` carries in its JSON schema extras.
ABSENT_WHEN_NONE = "x-absent-when-null"


def absent(description: str, **kwargs: Any) -> Any:
    """A field that defaults to None and is left out of the JSON while it is None."""
    return Field(default=None, description=description, json_schema_extra={ABSENT_WHEN_NONE: True}, **kwargs)


class ReportInvalid(ConfigError):
    """A report file is not what its model says: edited, truncated, or written by something else."""


class Record(BaseModel):
    """A part of a run report: no field the model does not name, each field checked again when it is set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    @model_serializer(mode="wrap")
    def _leave_out_absent(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name, info in type(self).model_fields.items():
                extra = info.json_schema_extra
                key = info.alias or name
                if isinstance(extra, dict) and extra.get(ABSENT_WHEN_NONE) and data.get(key, 0) is None:
                    del data[key]
        return data

    def as_json(self) -> dict[str, object]:
        """The JSON value, keys as the report spells them."""
        data: dict[str, object] = self.model_dump(mode="json", by_alias=True)
        return data

    def to_json(self) -> str:
        return json.dumps(self.as_json(), indent=2)

    def save(self, path: Path) -> Path:
        """Staged beside its final name, then renamed in place: a reader, or a signal that ends the process, never
        finds half a report."""
        return write_text(path, self.to_json() + "\n")

    @classmethod
    def read(cls, path: Path) -> Self:
        """The report at `path`, validated; ReportInvalid names the file and each field that is not as written."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ReportInvalid(f"{path}: cannot be read ({exc.strerror or exc})") from None
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            problems = [f"{path}: {_where(e['loc'])}: {e['msg']}" for e in exc.errors()]
            raise ReportInvalid(
                "\n  ".join(problems[:10]) + (f"\n  … and {len(problems) - 10} more" if len(problems) > 10 else ""),
                hint=f"it is not a {cls.__name__} as Forge writes it; run the command again to write a new one",
            ) from None


def _where(loc: tuple[int | str, ...]) -> str:
    """A validation error's location as the JSON's key path (`tests.0.status`); `(the whole file)` for the root."""
    return ".".join(str(part) for part in loc) or "(the whole file)"


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(text, encoding="utf-8")
    staged.replace(path)
    return path
