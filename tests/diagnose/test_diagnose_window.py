"""A long log is diagnosed from a window after a streamed scan (builders/diagnose/window.py): the same answer as the
whole log where the decisive lines are near the end, bounded memory, and a note saying what was read or cut."""

from __future__ import annotations

import functools
import io
import sys
from pathlib import Path

import pytest

from builders.diagnose import diagnose_file, diagnose_text
from builders.diagnose import window as window_module
from builders.diagnose.diagnosis import diagnose_log
from builders.diagnose.loglines import failing_step, split_log
from builders.diagnose.window import FULL_LINES, STEP_LINES, TAIL_LINES, select

LOGS = Path(__file__).resolve().parents[1] / "logs"
BUILDKIT = LOGS / "oom-killed--cc1plus-killed-after-400-steps.log"


def test_a_short_log_is_read_whole_and_says_nothing_about_a_window() -> None:
    assert diagnose_file(BUILDKIT).read is None


def test_the_window_keeps_the_step_structure_of_the_whole_log() -> None:
    """The streamed scan finds the failing step as failing_step does on the whole log, on every corpus log."""
    for path in sorted(LOGS.glob("*.log"))[:40]:
        text = path.read_bytes().decode("utf-8", errors="replace")
        lines = split_log(text)
        whole = failing_step(lines)
        raw = text.split("\n")
        chosen = select(functools.partial(enumerate, raw, 1))
        assert chosen.last == (lines[-1].number if lines else 0), path.name
        in_window = {n for n, _ in chosen.lines}
        assert chosen.step == (None if whole is None else frozenset(whole & in_window)), path.name


def test_a_long_log_padded_before_its_failing_step_keeps_its_answer(tmp_path: Path) -> None:
    text = BUILDKIT.read_text(encoding="utf-8")
    padding = [f"#19 77.0 [{k}/9000] Building CXX object kernel_{k}.cpp.o" for k in range(1, FULL_LINES + 500)]
    padded = "\n".join(padding) + "\n" + text
    short, long = diagnose_text(text), diagnose_text(padded)
    assert (long.category, long.line) == (short.category, short.line)
    assert long.line_number == (short.line_number or 0) + len(padding)
    assert long.read is not None and f"its last {TAIL_LINES:,} lines" in long.read
    path = tmp_path / "long.log"
    path.write_text(padded, encoding="utf-8")
    from_file = diagnose_file(path)
    assert from_file.model_dump() == long.model_dump()  # the streamed file and the text agree


def test_the_window_is_bounded_whatever_the_length() -> None:
    lines = [f"line {k}" for k in range(200_000)]
    chosen = select(lambda: enumerate(lines, start=1))
    assert len(chosen.lines) <= TAIL_LINES + STEP_LINES
    assert chosen.last == 200_000


def test_a_log_over_the_limit_is_read_from_its_end_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(window_module, "LOG_LIMIT_BYTES", 64 * 1024)
    text = BUILDKIT.read_text(encoding="utf-8")
    path = tmp_path / "big.log"
    path.write_text("x" * 300_000 + "\n" + "filler line\n" * 20_000 + text, encoding="utf-8")
    diagnosis = diagnose_log(path)
    assert diagnosis.category == "oom-killed"
    assert diagnosis.read is not None and "were not read" in diagnosis.read


def test_standard_input_is_spooled_with_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(window_module, "LOG_LIMIT_BYTES", 64 * 1024)
    data = BUILDKIT.read_bytes() + b"more output\n" * 20_000
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    diagnosis = diagnose_log("-")
    assert diagnosis.read is not None and "standard input: read its first" in diagnosis.read
