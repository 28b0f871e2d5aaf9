"""A lock between processes on one host, for the caches that several of Forge's processes fill at once."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) while the block runs; wait for it if another process
    holds it. flock, not a marker file: the kernel drops the lock when its holder exits, killed or not, so a
    crashed fetch never leaves the next one waiting forever."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
