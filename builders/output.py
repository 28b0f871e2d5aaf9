"""Where a command writes what the user asked for (`-o`): a folder made or a file written, or a usage error
naming the path and why, never an OSError's traceback."""

from __future__ import annotations

from pathlib import Path

from builders.errors import UsageError


def output_dir(path: Path, flag: str = "-o") -> Path:
    """The folder `flag` names, made with its parents when missing."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: exists and is not a folder", hint="name a folder, or move the file away")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{flag} {path}: cannot make the folder: {exc.strerror or exc}",
            hint="name a folder you can write to",
        ) from exc
    return path


def write_output(path: Path, text: str, flag: str = "-o") -> None:
    """One file the command was asked to write; its folder is made when missing."""
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a folder, not a file", hint="name a file")
    output_dir(path.parent, flag)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(
            f"{flag} {path}: cannot write it: {exc.strerror or exc}", hint="name a file you can write to"
        ) from exc
