"""Split a build log into clean, numbered lines and find the build step that failed."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\x1b[=>]")
# BuildKit `--progress=plain` prefixes every line with its step and elapsed time; BuildKit's closing summary
# repeats a step's last lines with the time only; `docker logs -t` and CI runners prepend ISO timestamps.
_PREFIXES = (
    re.compile(r"^#\d+ (?:\d+\.\d+ )?"),
    re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+"),
    re.compile(r"^\d{1,5}\.\d{3} "),
)
# A logging record's own prefix (vLLM's `(EngineCore_DP0 pid=212) ERROR 11-29 23:40:20 [core.py:708] `) makes
# the same message look different when it is logged and then re-raised; `key` compares messages without it.
_RECORD_PREFIX = re.compile(
    r"^(?:\(\w+ pid=\d+\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]+\] )?"
)
_LEGACY_STEP = re.compile(r"^Step \d+/\d+ : ")
_BUILDKIT_LINE = re.compile(r"^#(\d+) ")
_BUILDKIT_HEADER = re.compile(r"^#\d+ \[[^\]]+\] ")
_BUILDKIT_ERROR = re.compile(r"^#(\d+) (?:\d+\.\d+ )?ERROR\b")
# Matching is linear in line length; a megabyte of minified JSON or a progress bar on one line must not
# stall a diagnosis, and no decisive message is that long.
MAX_LINE_CHARS = 4000


@dataclass(frozen=True, slots=True, kw_only=True)
class LogLine:
    """One line of the log as a person reads it, and the same line stripped of machine prefixes."""

    number: int  # 1-based, counting newlines only, as editors and `grep -n` do
    raw: str  # as shown: ANSI codes and progress-bar redraws removed
    text: str  # without BuildKit/timestamp prefixes and surrounding blanks: what rules match against
    indent: int  # leading blanks after the prefixes (box glyphs count): tells a message's body from its header
    key: str  # text without a logging record's prefix: repeats of one message share it


def _visible(line: str) -> str:
    line = _ANSI.sub("", line.rstrip("\r"))
    if "\r" in line:
        # A progress bar redraws itself with carriage returns; the terminal shows only the last frame.
        frames = [frame for frame in line.split("\r") if frame.strip()]
        line = frames[-1] if frames else ""
    return line.rstrip()[:MAX_LINE_CHARS]


# pip and uv draw a failure as a box (`× ...`, `│ exit code: 1`, `╰─> ...`); the glyphs continue the line above.
_BOX_GLYPHS = " │╰─▶>"


def _strip_prefixes(line: str) -> tuple[str, int]:
    for prefix in _PREFIXES:
        line = prefix.sub("", line, count=1)
    text = line.lstrip()
    indent = len(line) - len(text)
    if text[:1] in ("│", "╰"):
        indent += len(text) - len(text.lstrip(_BOX_GLYPHS))
    return text.rstrip(), indent


def split_log(text: str) -> list[LogLine]:
    """Number lines the way editors and `grep -n` do: 1-based, split on newlines only."""
    lines: list[LogLine] = []
    for index, line in enumerate(text.split("\n"), start=1):
        visible = _visible(line)
        text, indent = _strip_prefixes(visible)
        key = _RECORD_PREFIX.sub("", text, count=1).strip()
        lines.append(LogLine(number=index, raw=visible, text=text, indent=indent, key=key))
    if lines and not lines[-1].raw:
        lines.pop()
    return lines


def failing_step(lines: list[LogLine]) -> frozenset[int] | None:
    """Line numbers of the build step that failed, or None when the log has no step structure.

    Steps that completed cannot have caused the failure, so their errors count for less. BuildKit
    interleaves parallel stages line by line (`#12 ...`, `#13 ...`): the failing one is the step that
    logged `#N ERROR`, and BuildKit's closing summary after the last `#` line belongs to it. The classic
    builder runs steps in order, so the failing step is everything from the last `Step k/n :` on.
    """
    if any(_BUILDKIT_HEADER.match(line.raw) for line in lines):
        failed: str | None = None
        last_step_line = 0
        for line in lines:
            step = _BUILDKIT_LINE.match(line.raw)
            if step is None:
                continue
            last_step_line = line.number
            if _BUILDKIT_ERROR.match(line.raw):
                failed = step.group(1)
        if failed is None:
            for line in reversed(lines):
                step = _BUILDKIT_LINE.match(line.raw)
                if step is not None:
                    failed = step.group(1)
                    break
        prefix = f"#{failed} "
        return frozenset(line.number for line in lines if line.raw.startswith(prefix) or line.number > last_step_line)
    starts = [line.number for line in lines if _LEGACY_STEP.match(line.raw)]
    if starts:
        return frozenset(line.number for line in lines if line.number >= starts[-1])
    return None
