"""The run skeleton (builders/runs.py) that smoke, sweep and verify-repro run on: phases in order with their
seconds, how the run ended and in which phase, the report written before the teardown, and signals handled as
the CLI documents, the last in a real child process that is sent them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from builders.runs import Phase, ended_by_signal, run_phases

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Recording:
    """A run context that writes down what the skeleton asks of it, in order."""

    events: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    ended: tuple[str | None, str | None] | None = None
    skip: bool = False

    def step(self, name: str) -> AbstractContextManager[object]:
        self.events.append(f"step {name}")
        return contextlib.nullcontext()

    def record_phase(self, name: str, seconds: float) -> None:
        self.seconds[name] = seconds

    def record_end(self, error: BaseException | None, phase: str | None) -> None:
        kind = None if error is None else ("interrupted" if isinstance(error, KeyboardInterrupt) else "failed")
        self.ended = (kind, phase)
        self.events.append(f"end {kind} in {phase}")

    def write_report(self) -> None:
        self.events.append("report")

    def teardown(self, error: BaseException | None) -> None:
        self.events.append(f"teardown after {type(error).__name__ if error else 'success'}")

    def end_at_once(self, phase: str | None) -> None:
        self.events.append(f"at once in {phase}")


def _phases(fail_with: BaseException | None = None) -> list[Phase[Recording]]:
    def first(ctx: Recording) -> None:
        time.sleep(0.02)

    def second(ctx: Recording) -> None:
        if fail_with is not None:
            raise fail_with

    def third(ctx: Recording) -> None:
        ctx.events.append("third ran")

    return [
        Phase("first", first),
        Phase("skipped", third, wanted=lambda ctx: not ctx.skip),
        Phase("second", second),
        Phase("third", third),
    ]


def test_phases_run_in_order_timed_then_the_report_is_written_before_the_teardown() -> None:
    ctx = Recording(skip=True)
    run_phases(ctx, _phases())
    assert ctx.events == [
        "step first",
        "step second",
        "step third",
        "third ran",
        "end None in None",
        "report",
        "teardown after success",
    ]
    assert list(ctx.seconds) == ["first", "second", "third"] and ctx.seconds["first"] >= 0.02


@pytest.mark.parametrize(
    ("error", "kind"),
    [(RuntimeError("a defect"), "failed"), (KeyboardInterrupt(), "interrupted")],
    ids=["failure", "ctrl-c"],
)
def test_a_run_that_stops_names_its_phase_writes_its_report_tears_down_and_raises(
    error: BaseException, kind: str
) -> None:
    ctx = Recording(skip=True)
    with pytest.raises(type(error)):
        run_phases(ctx, _phases(fail_with=error))
    assert ctx.ended == (kind, "second")
    assert "second" in ctx.seconds and "third" not in ctx.seconds and "third ran" not in ctx.events
    assert ctx.events[-2:] == ["report", f"teardown after {type(error).__name__}"]
    assert ended_by_signal(error) == ("SIGINT" if kind == "interrupted" else None)


# A run in a child process, as the CLI runs one: each event appended to a file as it happens, the phase sleeping
# until it is signalled, the teardown as slow as asked; the CLI's exit code for an interrupt.
CHILD = """
import sys, time
from contextlib import nullcontext
from pathlib import Path
from builders import interrupt
from builders.runs import Phase, ended_by_signal, run_phases
log, serve_s, teardown_s = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])

def note(text):
    with log.open("a") as f:
        f.write(text + "\\n")

class Ctx:
    def step(self, name):
        return nullcontext()
    def record_phase(self, name, seconds):
        note(f"seconds {name}")
    def record_end(self, error, phase):
        note(f"end {ended_by_signal(error)} in {phase}")
    def write_report(self):
        note("report")
    def teardown(self, error):
        note("teardown starts")
        print("tearing down", flush=True)
        time.sleep(teardown_s)
        note("teardown done")
    def end_at_once(self, phase):
        note(f"at once in {phase}")

def serve(ctx):
    print("serving", flush=True)
    time.sleep(serve_s)

try:
    with interrupt.handled():
        run_phases(Ctx(), [Phase("start", lambda ctx: None), Phase("serve", serve)])
except KeyboardInterrupt as exc:
    sys.exit(interrupt.exit_code_of(exc))
"""


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Callable[[float, float], subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(serve_s: float, teardown_s: float) -> subprocess.Popen[str]:
        script = tmp_path / "child.py"
        script.write_text(CHILD)
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "events"), str(serve_s), str(teardown_s)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)],
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "serving"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _events(tmp_path: Path) -> list[str]:
    return (tmp_path / "events").read_text().splitlines()


def test_sigterm_records_the_phase_writes_the_report_then_tears_down_and_exits_143(
    tmp_path: Path, child: Callable[[float, float], subprocess.Popen[str]]
) -> None:
    proc = child(60.0, 0.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert _events(tmp_path) == [
        "seconds start",
        "seconds serve",
        "end SIGTERM in serve",
        "report",
        "teardown starts",
        "teardown done",
    ]


def test_a_first_signal_during_the_teardown_waits_for_it_to_end(
    tmp_path: Path, child: Callable[[float, float], subprocess.Popen[str]]
) -> None:
    proc = child(0.0, 1.5)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "tearing down"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert _events(tmp_path) == [
        "seconds start",
        "seconds serve",
        "end None in None",
        "report",
        "teardown starts",
        "teardown done",
    ]


def test_a_second_signal_ends_at_once_naming_the_phase_the_first_stopped(
    tmp_path: Path, child: Callable[[float, float], subprocess.Popen[str]]
) -> None:
    proc = child(60.0, 30.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "tearing down"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 130
    assert _events(tmp_path) == [
        "seconds start",
        "seconds serve",
        "end SIGTERM in serve",
        "report",
        "teardown starts",
        "at once in serve",
    ]
