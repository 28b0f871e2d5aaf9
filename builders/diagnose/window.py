"""A long log is diagnosed from a window: a streamed scan for its step structure, then the rules on its end.

Every rule on every line costs about a third of a millisecond a line here, so a 50 MB compile log (half a million
lines) would take minutes. A build stops where it failed: what decides is at the end of the log and at the end of
the step that failed (BuildKit interleaves parallel steps, so that step's last lines can lie far above the log's
end). The scoring weighs a line by its closeness to the end, halving every 200 lines, so a line 2,000 lines up
scores at most 0.7 of what it would at the end: the window keeps the log's last TAIL_LINES lines and the failing
step's last STEP_LINES lines, and the rest of the log is read once for its step structure only (which step failed,
where the last one began), in constant memory.

A log of FULL_LINES lines or fewer is read whole, as before: every log of tests/logs is, so the window changes no
diagnosis of the corpus (benchmarks/bench_diagnose.py gives the same figures). What a window can miss: a cause
printed only more than TAIL_LINES lines before the end and more than STEP_LINES lines before the end of the failing
step. The diagnosis then says which lines were read.
"""

from __future__ import annotations

import collections
import io
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from builders.diagnose.loglines import StepScan, visible
from builders.errors import UsageError
from builders.input_files import refuse_special

FULL_LINES = 6_000
"""A log this long or shorter is read whole (the corpus's longest has 5,184 lines)."""
FULL_BYTES = 32 * 2**20
"""... unless its lines are so long that it holds more than this."""
TAIL_LINES = 2_000
STEP_LINES = 2_000
LINE_CAP_BYTES = 2**20
"""A line longer than this (a progress bar redrawn a million times) is cut here; rules read 4,000 characters."""
LOG_LIMIT_BYTES = 2**30
"""A log larger than this is read from its last LOG_LIMIT_BYTES bytes: time grows with size, and the end decides."""

_CHUNK = 4 * 2**20
HINT = "pass the path of a saved build log, or '-' with the log on standard input"


@dataclass(frozen=True, kw_only=True)
class Window:
    lines: list[tuple[int, str]]  # (number in the log, visible text), in order
    step: frozenset[int] | None  # the numbers of window lines in the failing step; None: the log has no steps
    last: int  # the number of the log's last line

    def note(self, cut: str | None) -> str:
        read = (
            f"a log of {self.last:,} lines: the rules read its last {TAIL_LINES:,} lines"
            + (f" and the last {STEP_LINES:,} lines of the step that failed" if self.step is not None else "")
            + f" ({len(self.lines):,} lines); the rest was scanned for its step structure only"
        )
        return f"{cut}; {read}" if cut else read


def select(numbered: Callable[[], Iterable[tuple[int, str]]]) -> Window:
    """Two passes over the log's lines (`numbered` gives them again for the second): the step structure, then the
    window's lines."""
    steps = StepScan()
    number, last_line = 0, ""
    for number, line in numbered():
        # Only a line that shows `#` or `Step ` first is a step line; ANSI codes and redraws can hide what it
        # shows first, so those lines are made visible (the cost of a regex) and the rest are not.
        first = line[:1]
        if first in _STEP_STARTS or "\r" in line:
            steps.feed(number, visible(line))
        last_line = line
    # As split_log: a last line with nothing visible (the newline that ends the file) is no line.
    last = number - 1 if not visible(last_line) else number
    # Raw lines are kept (up to LINE_CAP_BYTES each), and made visible only once chosen; a very long one is made
    # visible at once, so that the window holds at most 4,000 characters of it.
    tail: collections.deque[tuple[int, str, bool]] = collections.deque(maxlen=TAIL_LINES)
    step: collections.deque[tuple[int, str, bool]] = collections.deque(maxlen=STEP_LINES)
    for number, line in numbered():
        if number > last:
            break
        entry = (number, visible(line), True) if len(line) > _KEEP_RAW_CHARS else (number, line, False)
        tail.append(entry)
        if steps.structured and _in_step(steps, number, line):
            step.append(entry)
    chosen = sorted({n: (text, shown) for n, text, shown in (*step, *tail)}.items())
    lines = [(n, text if shown else visible(text)) for n, (text, shown) in chosen]
    in_step = frozenset(n for n, text in lines if steps.in_failing_step(n, text)) if steps.structured else None
    return Window(lines=lines, step=in_step, last=last)


_STEP_STARTS = frozenset({"#", "S", "\x1b"})
_KEEP_RAW_CHARS = 8192


def _in_step(steps: StepScan, number: int, line: str) -> bool:
    if line[:1] in _STEP_STARTS or "\r" in line:
        return steps.in_failing_step(number, visible(line))
    return steps.in_failing_step(number, line)


class LogSource:
    """A log file opened for the two passes (standard input is spooled to a temporary file first, bounded)."""

    def __init__(self, handle: BinaryIO, name: str, *, start: int = 0, cut: str | None = None) -> None:
        self.handle = handle
        self.name = name
        self.start = start
        self.cut = cut

    def head(self, size: int = 8192 + 512) -> bytes:
        self.handle.seek(self.start)
        return self.handle.read(size)

    def size(self) -> int:
        self.handle.seek(0, os.SEEK_END)
        return self.handle.tell() - self.start

    def lines(self) -> Iterator[tuple[int, str]]:
        """(number, text) for each line, numbered from 1; a line longer than LINE_CAP_BYTES is cut there."""
        self.handle.seek(self.start)
        number = 0
        pending = b""
        skipping = False  # inside an overlong line, after its first LINE_CAP_BYTES
        while chunk := self.handle.read(_CHUNK):
            if skipping:
                end = chunk.find(b"\n")
                if end < 0:
                    continue
                chunk, skipping = chunk[end + 1 :], False
            pending += chunk
            cut = pending.rfind(b"\n")
            if cut < 0:
                if len(pending) > LINE_CAP_BYTES:
                    number += 1
                    yield number, pending[:LINE_CAP_BYTES].decode("utf-8", errors="replace")
                    pending, skipping = b"", True
                continue
            whole, pending = pending[:cut], pending[cut + 1 :]
            for line in whole.decode("utf-8", errors="replace").split("\n"):
                number += 1
                yield number, line if len(line) <= LINE_CAP_BYTES else line[:LINE_CAP_BYTES]
        if not skipping:
            number += 1
            yield number, pending.decode("utf-8", errors="replace")

    def read_text(self) -> str:
        self.handle.seek(self.start)
        return self.handle.read().decode("utf-8", errors="replace")

    def close(self) -> None:
        self.handle.close()


def open_log(path: Path | str) -> LogSource:
    """A build log to diagnose: a regular file, or '-' for standard input. A terminal, a character device (/dev/zero
    never ends), a FIFO with no writer (it would block) and a socket are refused before any read."""
    if str(path) == "-":
        return _spool_stdin()
    log_path = Path(path)
    info = refuse_special(log_path, what="build log", hint=HINT)
    try:
        handle = log_path.open("rb")
    except OSError as exc:
        raise UsageError(f"cannot read build log {log_path}: {exc.strerror}", hint="check its permissions") from None
    name = f"build log {log_path}"
    if info.st_size <= LOG_LIMIT_BYTES:
        return LogSource(handle, name)
    # Too large to read in a time anyone waits: its end decides, so read that, from the first whole line in it.
    handle.seek(info.st_size - LOG_LIMIT_BYTES)
    while (part := handle.readline(LINE_CAP_BYTES)) and not part.endswith(b"\n"):
        pass  # the rest of the line the cut fell in, read a bounded piece at a time
    start = handle.tell()
    cut = (
        f"{log_path} is {info.st_size / 2**20:,.0f} MiB: its first {start / 2**20:,.0f} MiB were not read, and line "
        "numbers count from the first whole line after them"
    )
    return LogSource(handle, name, start=start, cut=cut)


def _spool_stdin() -> LogSource:
    stream = sys.stdin.buffer
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        mode = None
    if mode is not None and stat.S_ISCHR(mode):
        what = "a terminal" if stream.isatty() else "a character device"
        raise UsageError(f"standard input is {what}, not a log", hint=HINT)
    # Closed by diagnose_log when the diagnosis is done; a file on disk, so a long pipe costs no memory.
    spool = tempfile.TemporaryFile(prefix="forge-diagnose-")  # noqa: SIM115
    copied = 0
    while copied < LOG_LIMIT_BYTES and (chunk := stream.read(min(_CHUNK, LOG_LIMIT_BYTES - copied))):
        spool.write(chunk)
        copied += len(chunk)
    cut = None
    if copied >= LOG_LIMIT_BYTES and stream.read(1):
        cut = f"standard input: read its first {LOG_LIMIT_BYTES / 2**20:,.0f} MiB; the rest was not read"
    return LogSource(spool, "standard input", cut=cut)
