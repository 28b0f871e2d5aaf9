"""One voice: how Forge's own lines, its steps and its tables reach the user, on a terminal and in a CI log.

Steps print when they start and how long they took when they end; under GitHub Actions or GitLab CI each step
is a fold group, so a 2,000-line build log opens on its table of contents. Tables fold to the terminal's width
on a TTY; without one (a CI log, a pipe) they are plain aligned text at full width, never cut to 80 columns.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Literal, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from builders.redact import mask_urls

CI = Literal["github", "gitlab"]
PREFIX = "forge: "


def ci_system(env: Mapping[str, str] | None = None) -> CI | None:
    """The CI whose fold-group markers the log should print, from the variables each sets in every job."""
    env = os.environ if env is None else env
    if env.get("GITHUB_ACTIONS") == "true":
        return "github"
    if env.get("GITLAB_CI") == "true":
        return "gitlab"
    return None


class Log:
    """Forge's output channel. Also callable as a plain line sink: a line starting with "forge: " is Forge's own
    message, any other line is tool output (the build's), which `quiet` hides."""

    def __init__(
        self,
        write: Callable[[str], None] | None = None,
        *,
        ci: CI | Literal["detect"] | None = "detect",
        quiet: bool = False,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        """on_line: sees every line, shown or hidden (the CLI's progress line follows the compile even when quiet)."""
        self._emit = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self._on_line = on_line
        self.ci: CI | None = ci_system() if ci == "detect" else ci
        self.quiet = quiet
        self.timings: dict[str, float] = {}

    def _write(self, line: str) -> None:
        # The build's own output too: pip and apt print index and mirror URLs, user-info included.
        line = mask_urls(line)
        self._emit(line)
        if self._on_line:
            self._on_line(line)

    def __call__(self, line: str) -> None:
        if line.startswith(PREFIX):
            self._write(line)
        else:
            self.output(line)

    def info(self, message: str) -> None:
        self._write(PREFIX + message)

    def warning(self, message: str) -> None:
        self._write(f"{PREFIX}warning: {message}")
        if self.ci == "github":
            # One line in the job's annotations, besides the log line itself.
            self._write(f"::warning title=forge::{message.splitlines()[0] if message else ''}")

    def output(self, line: str) -> None:
        if not self.quiet:
            self._write(line)
        elif self._on_line:
            self._on_line(line)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A named step: announced, folded under CI, and timed whether it ends well or not."""
        start = time.monotonic()
        section = re.sub(r"[^a-z0-9_]", "_", name.lower())
        if self.ci == "github":
            self._write(f"::group::{PREFIX}{name}")
        elif self.ci == "gitlab":
            self._write(f"\x1b[0Ksection_start:{int(time.time())}:{section}[collapsed=true]\r\x1b[0K{PREFIX}{name}")
        else:
            self._write(f"{PREFIX}▸ {name}")
        outcome = "failed after"
        try:
            yield
            outcome = "done in"
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (builders/interrupt.py)
            outcome = "interrupted after"
            raise
        finally:
            seconds = time.monotonic() - start
            self.timings[name] = round(seconds, 2)
            if self.ci == "github":
                self._write("::endgroup::")
            elif self.ci == "gitlab":
                self._write(f"\x1b[0Ksection_end:{int(time.time())}:{section}\r\x1b[0K")
            self._write(f"{PREFIX}{name}: {outcome} {seconds:.1f} s")


# Wide enough for every table Forge prints on one line per row; rich would otherwise assume 80 columns
# whenever the stream is not a terminal and fold each cell until a CI log cannot be read.
CI_LOG_WIDTH = 240


def console(stream: TextIO | None = None, *, highlight: bool = True) -> Console:
    """A rich console for commands that print rich tables (smoke, sweep, repro): a terminal's own width on a
    terminal, CI_LOG_WIDTH anywhere else, so rows stay whole in CI logs and files."""
    stream = stream or sys.stderr
    return Console(file=stream, highlight=highlight, width=None if stream.isatty() else CI_LOG_WIDTH)


def as_log(sink: Log | Callable[[str], None]) -> Log:
    return sink if isinstance(sink, Log) else Log(sink, ci=None)


Cell = str | Text


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    stream: TextIO | None = None,
    lines_between: bool = False,
) -> None:
    """Rich's table on a terminal; plain aligned text at full width anywhere else (CI logs, pipes, files)."""
    stream = stream or sys.stdout
    if stream.isatty():
        table = Table(title=title, show_lines=lines_between, title_justify="left")
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*row)
        Console(file=stream).print(table)
        return
    cells = [list(columns), *[[c.plain if isinstance(c, Text) else c for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()

    print(title, file=stream)
    print(line(cells[0]), file=stream)
    print(line(["-" * w for w in widths]), file=stream)
    for row in cells[1:]:
        print(line(row), file=stream)
