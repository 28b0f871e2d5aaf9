"""Credentials reach the compile step alone, as a build secret (`RUN --mount=type=secret`, BuildKit's and
buildah's): a file outside the build context, mounted for that one RUN, in no layer, no label and no cache key.

The file holds every sccache setting, not only the credentials: where the cache lives is then no part of any
layer's key either, so two runners pointing at two Redis servers share layers. After the build the log is
scrubbed of every credential value all the same, should a tool print one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from builders.cache.settings import CompilerCache

SECRET_ID = "forge_compiler_cache"
MASK = "***"


def secret_lines(cache: CompilerCache, *, require: bool) -> str:
    """KEY=VALUE, one a line: containers/scripts/compiler_cache.py reads it without a shell."""
    values = {
        **cache.settings,
        **cache.secrets,
        "FORGE_CACHE_BACKEND": cache.backend,
        "FORGE_CACHE_ENDPOINT": cache.endpoint,
        "FORGE_REQUIRE_CACHE": "1" if require else "0",
    }
    for key, value in values.items():
        assert "\n" not in value and "\n" not in key, "settings.py refuses line breaks where values enter"
    return "".join(f"{key}={value}\n" for key, value in sorted(values.items()))


def write_secret(cache: CompilerCache, *, require: bool, scratch: Path | None = None) -> Path:
    """The secret file in a folder of its own (0700, the file 0600), never inside a build context: the caller
    removes the folder when the build ends."""
    folder = Path(tempfile.mkdtemp(prefix="forge-cache-secret-", dir=scratch))
    folder.chmod(0o700)
    path = folder / SECRET_ID
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(secret_lines(cache, require=require))
    return path


def sensitive(cache: CompilerCache) -> tuple[str, ...]:
    """The values no output may hold (a short one, such as a one-letter user name, would mask half the log and
    proves nothing: at least four characters)."""
    return tuple(sorted({v for v in cache.secrets.values() if len(v) >= 4}, key=len, reverse=True))


def mask(text: str, values: Iterable[str]) -> str:
    for value in values:
        text = text.replace(value, MASK)
    return text


def scrub_file(path: Path, values: Iterable[str]) -> bool:
    """Mask every credential in a file Forge wrote (the build log); True when one was found."""
    values = tuple(values)
    if not values or not path.exists():
        return False
    text = path.read_text(errors="replace")
    cleaned = mask(text, values)
    if cleaned == text:
        return False
    path.write_text(cleaned)
    return True
