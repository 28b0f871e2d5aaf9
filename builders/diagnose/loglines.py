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
    # Jenkins' timestamper and many CI viewers print the wall clock alone.
    re.compile(r"^\[?\d\d:\d\d:\d\d(?:[.,]\d+)?\]? "),
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
    continues: int | None = None  # the number of the line this one continues, when it is a wrapped line's tail


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


def visible(line: str) -> str:
    """A line as a person sees it (ANSI codes and progress-bar redraws removed), cut to MAX_LINE_CHARS."""
    if "\x1b" not in line and "\r" not in line:
        return line.rstrip()[:MAX_LINE_CHARS]  # what _visible gives such a line, without its regex
    return _visible(line)


def _line(number: int, shown: str) -> LogLine:
    text, indent = _strip_prefixes(shown)
    key = _RECORD_PREFIX.sub("", text, count=1).strip()
    return LogLine(number=number, raw=shown, text=text, indent=indent, key=key)


def split_log(text: str) -> list[LogLine]:
    """Number lines the way editors and `grep -n` do: 1-based, split on newlines only."""
    lines = [_line(index, visible(line)) for index, line in enumerate(text.split("\n"), start=1)]
    if lines and not lines[-1].raw:
        lines.pop()
    return _rejoin(lines)


def split_window(shown: list[tuple[int, str]]) -> list[LogLine]:
    """Lines of a window of a long log, each (number, visible text) as `visible` gave it: numbered as in the
    whole log, and rejoined within each run of consecutive lines (a wrapped line never joins across a gap)."""
    lines = [_line(number, text) for number, text in shown]
    runs: list[list[LogLine]] = []
    for line in lines:
        if runs and runs[-1][-1].number + 1 == line.number:
            runs[-1].append(line)
        else:
            runs.append([line])
    return [line for run in runs for line in _rejoin(run)]


# A wrapped line's tail never starts a message of its own: a tool's `name: `, a `file:line:` location, a
# compiler's context lines, a list item, a log record, a prompt, a box glyph or a BuildKit/CMake marker.
_MESSAGE_START = re.compile(
    r"^(?:[\w.+\[\]-]+: |[\w.+-]+ +-|\S+ +(?:fatal|error|warning) *:|\S+:\d+(?::\d+)?[:,]|[/~.]|[A-Za-z]:[\\/]|In file included|\s*from \S+:\d+|[-*•+#>$│╰├×|]|\[|\(|"
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|Error|Warning|Note|Traceback|File \"|CMake |Call Stack|"
    r"Step \d|Collecting |Building |Running |Installing |Downloading |Requirement |Successfully |"
    r"Cloning |Get:|Hit:|Err:|Ign:|E: |W: |N: )\b)"
)
# A line ending like this finished its sentence or opens a block; what follows is a new line, not its tail.
_ENDS_MESSAGE = re.compile(r"[.!?:;{}\]`]$|^\W*$")
# Wrapping happens at a width; a line much shorter than the lines around it was not wrapped.
WRAP_MIN_CHARS = 60
WRAP_WINDOW_LINES = 40
WRAP_MAX_WIDTH = 240
WRAP_SLACK_CHARS = 12
MAX_WRAPPED_TAILS = 3


def _wrap_width(lines: list[LogLine], index: int) -> int | None:
    """The width that a wrapper (a terminal, an issue body, a CI viewer) filled around this line, or None when
    this line is not at such a width: a wrapper fills every line it cuts to about the same width, so another
    line nearby must come as close to it as this one."""
    head = len(lines[index].raw)
    near = [
        len(line.raw)
        for line in lines[max(0, index - WRAP_WINDOW_LINES) : index + WRAP_WINDOW_LINES + 1]
        if len(line.raw) <= WRAP_MAX_WIDTH
    ]
    width = max(near, default=0)
    if head > WRAP_MAX_WIDTH or head < width - WRAP_SLACK_CHARS:
        return None
    if sum(1 for length in near if length >= width - WRAP_SLACK_CHARS) < 2:
        return None
    return width


def _is_tail(head: LogLine, tail: LogLine, width: int | None) -> bool:
    """Whether `tail` is the rest of `head`, cut by a wrapper. Both: the head is long and its sentence
    unfinished, and the tail starts no message of its own at the head's indent (pip's indented subprocess
    output) or at column 0 (a terminal's, an issue body's or a viewer's wrap). Then either the head filled the
    width its neighbours show (the tail's first word would not have fitted on it, and the tail is no wider),
    or, where a short excerpt shows no width, the tail goes on in lower case: the middle of a sentence."""
    if not head.text or not tail.text or len(head.raw) < WRAP_MIN_CHARS:
        return False
    if _ENDS_MESSAGE.search(head.text) or tail.indent not in (0, head.indent) or _MESSAGE_START.match(tail.text):
        return False
    if width is not None and len(tail.raw) <= width:
        first_word = tail.text.split(" ", 1)[0]
        if len(head.raw) + 1 + len(first_word) > width:
            return True
    last_word, first_word = head.text.rsplit(" ", 1)[-1], tail.text.split(" ", 1)[0]
    return last_word.isalpha() and first_word.isalpha() and first_word.islower()


def _rejoin(lines: list[LogLine]) -> list[LogLine]:
    """Rejoin soft-wrapped lines: the head carries the whole message (what rules match), keeping its own
    number and raw text for the report; each tail stays in place, blank to the rules, and names its head."""
    joined = list(lines)
    index = 0
    while index < len(joined):
        head = joined[index]
        width = _wrap_width(joined, index) if head.text else None
        text, end = head.text, index
        while end + 1 < len(joined) and end - index < MAX_WRAPPED_TAILS:
            last = joined[end]
            nxt = joined[end + 1]
            if not _is_tail(last, nxt, width):
                break
            # A wrapper that cut inside a word leaves no blank at the cut: join those halves without one.
            cut_in_word = width is not None and len(last.raw) >= width and last.raw[-1:].isalnum()
            glue = "" if cut_in_word and nxt.text[:1].islower() else " "
            text = f"{text}{glue}{nxt.text}"
            end += 1
        if end > index:
            key = _RECORD_PREFIX.sub("", text, count=1).strip()
            joined[index] = LogLine(number=head.number, raw=head.raw, text=text, indent=head.indent, key=key)
            for tail in range(index + 1, end + 1):
                old = joined[tail]
                joined[tail] = LogLine(
                    number=old.number, raw=old.raw, text="", indent=old.indent, key="", continues=head.number
                )
        index = end + 1
    return joined


def failing_step(lines: list[LogLine]) -> frozenset[int] | None:
    """Line numbers of the build step that failed, or None when the log has no step structure.

    Steps that completed cannot have caused the failure, so their errors count for less. BuildKit
    interleaves parallel stages line by line (`#12 ...`, `#13 ...`): the failing one is the step that
    logged `#N ERROR`, and BuildKit's closing summary after the last `#` line belongs to it. The classic
    builder runs steps in order, so the failing step is everything from the last `Step k/n :` on.
    """
    steps = StepScan()
    for line in lines:
        steps.feed(line.number, line.raw)
    if not steps.structured:
        return None
    return frozenset(line.number for line in lines if steps.in_failing_step(line.number, line.raw))


class StepScan:
    """The step structure of a log, read one visible line at a time: what `failing_step` needs, in one pass and
    constant memory, so that a log too long to hold is split the same way as a short one."""

    def __init__(self) -> None:
        self.buildkit = False  # a BuildKit step header was seen
        self.failed: str | None = None  # the step that logged `#N ERROR`
        self.last_step: str | None = None  # the step of the last `#N ` line
        self.last_step_line = 0
        self.legacy_start: int | None = None  # the last `Step k/n :` line

    def feed(self, number: int, shown: str) -> None:
        if shown[:1] == "#":
            if not self.buildkit and _BUILDKIT_HEADER.match(shown):
                self.buildkit = True
            step = _BUILDKIT_LINE.match(shown)
            if step is not None:
                self.last_step_line = number
                self.last_step = step.group(1)
                if _BUILDKIT_ERROR.match(shown):
                    self.failed = step.group(1)
        elif shown[:5] == "Step " and _LEGACY_STEP.match(shown):
            self.legacy_start = number

    @property
    def structured(self) -> bool:
        return self.buildkit or self.legacy_start is not None

    def in_failing_step(self, number: int, shown: str) -> bool:
        if self.buildkit:
            failed = self.failed if self.failed is not None else self.last_step
            return shown.startswith(f"#{failed} ") or number > self.last_step_line
        return self.legacy_start is not None and number >= self.legacy_start
