"""Reading an engine's pinned source archive without unpacking it: one member's text, and the line that states a
fact, numbered as a citation reads it. Each engine's gates cite what they read this way."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path


def sdist_member(sdist: Path, relative: str) -> str | None:
    """A text file of an sdist, by its path under the sdist's top folder, read without unpacking; None if absent."""
    with tarfile.open(sdist) as tar:
        top = tar.next()
        if top is None:
            return None
        try:
            member = tar.extractfile(f"{top.name.split('/', 1)[0]}/{relative}")
        except KeyError:
            return None
        return member.read().decode("utf-8", errors="replace") if member else None


def find_line(text: str, pattern: str) -> tuple[int, re.Match[str]] | None:
    """The first line matching `pattern`, numbered from 1 as a citation reads it, and its match."""
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.search(pattern, line)
        if match:
            return number, match
    return None
