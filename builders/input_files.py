"""Files a user names on the command line (a build log, a CPU-flags file, a CSV), read with a bound.

A character device (`/dev/zero`) never ends, a FIFO with no writer blocks forever and a socket cannot be read:
each is refused up front, naming the path. A regular file is read up to a limit; what lies beyond it is cut and
the caller says so.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from builders.errors import UsageError

_SPECIAL = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def refuse_special(path: Path, *, what: str, hint: str) -> os.stat_result:
    """The file's stat when it is a regular file (links followed); UsageError naming it otherwise.

    Checked with stat before any open: opening a FIFO for reading blocks until a writer comes."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist", hint=hint) from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}", hint=hint) from None
    for test, kind in _SPECIAL:
        if test(info.st_mode):
            raise UsageError(f"{what} {path} is {kind}, not a file", hint=hint)
    return info


@dataclass(frozen=True, kw_only=True)
class Read:
    data: bytes
    size: int  # the file's whole size
    cut: int  # bytes not read (0: all of it)

    def note(self, path: Path | str, limit: int) -> str | None:
        """What a caller prints when the read was cut, or None."""
        if not self.cut:
            return None
        return f"{path}: read its first {_mib(limit)} of {_mib(self.size)}; the last {self.cut:,} bytes were not read"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def read_bounded(path: Path, *, limit: int, what: str, hint: str) -> Read:
    """At most `limit` bytes of a regular file; special files are refused before they are opened."""
    info = refuse_special(path, what=what, hint=hint)
    try:
        # O_NONBLOCK: should the path have become a FIFO since the stat, the open does not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}", hint=hint) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise UsageError(f"{what} {path} is not a regular file", hint=hint)
        data = handle.read(limit)
    size = max(info.st_size, len(data))
    return Read(data=data, size=size, cut=max(0, size - len(data)))


def read_small_text(path: Path, *, limit: int, what: str, hint: str) -> str:
    """A small text file (a CSV, a JSON report, a YAML file) whole, as UTF-8: special files, files larger than
    `limit` and undecodable bytes are refused naming the path. Cutting such a file would change what it says."""
    got = read_bounded(path, limit=limit, what=what, hint=hint)
    if got.cut:
        raise UsageError(
            f"{what} {path} is {_mib(got.size)}; one is at most {_mib(limit)}, so this is not the file meant",
            hint=hint,
        )
    try:
        return got.data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{what} {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})", hint=hint
        ) from None
