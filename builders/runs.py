"""One skeleton for every run that leaves a report (smoke, sweep, verify-repro; the build's loop has the same
shape): a table of phases over one context, `for phase in phases: phase(ctx)`.

The skeleton, not the phases, owns what every run must get right the same way:
- each phase's seconds, recorded whether it ends or raises;
- how the run ended (succeeded, failed, or interrupted by Ctrl-C, SIGTERM or SIGHUP, builders/interrupt.py), and
  the phase it ended in;
- the report written before the teardown starts, so it is true even if a second signal then ends everything;
- the teardown, whatever ended the run, with a first signal held until it is done (a teardown is bounded);
- a second signal: the context's quick `end_at_once` (kill what runs, write the report), then the process exits.

The exception that ended the run is raised again afterwards: the CLI turns an interrupt into exit 128 + the
signal's number (130 for Ctrl-C), and a ForgeError into its own exit code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from builders import interrupt


class Run(Protocol):
    """What the skeleton asks of a run's context; the phases read and fill in the rest of it."""

    def step(self, name: str) -> AbstractContextManager[object]:
        """How a phase is shown while it runs (a log step, a CI fold group); `contextlib.nullcontext()` for none."""
        ...

    def record_phase(self, name: str, seconds: float) -> None:
        """A phase's seconds, in the report; called for the phase that raised too."""
        ...

    def record_end(self, error: BaseException | None, phase: str | None) -> None:
        """How the run ended: None succeeded; else what stopped it, during `phase` (None: before the first)."""
        ...

    def write_report(self) -> None:
        """Write the report as it stands; called before the teardown, and again by a teardown that adds to it."""
        ...

    def teardown(self, error: BaseException | None) -> None:
        """Stop and remove what the run started, whatever ended it."""
        ...

    def end_at_once(self, phase: str | None) -> None:
        """A second signal, before the process exits: quick, no waiting (kill, do not stop), the report written."""
        ...


R = TypeVar("R", bound=Run)


def always(_ctx: object) -> bool:
    return True


@dataclass(frozen=True)
class Phase(Generic[R]):
    """One row of a run's table: its name in the report and the log, what it does, and whether this run wants it."""

    name: str
    run: Callable[[R], None]
    wanted: Callable[[R], bool] = always


@dataclass
class _Clock:
    """The phase under way, and since when; `open` until its seconds are recorded."""

    name: str | None = None
    started: float = 0.0
    open: bool = False

    def seconds(self) -> float:
        return round(time.monotonic() - self.started, 2)


def run_phases(ctx: R, phases: Iterable[Phase[R]]) -> None:
    """Run the wanted phases in order over `ctx`, then tear down (module docstring)."""
    clock = _Clock()

    def at_once() -> None:
        if clock.open and clock.name is not None:  # its step never ended: its time so far
            ctx.record_phase(clock.name, clock.seconds())
        ctx.end_at_once(clock.name)

    # handled(): SIGTERM and SIGHUP arrive as Ctrl-C does, also for a library caller outside the CLI (nested use
    # is the outer one's).
    with interrupt.handled(), interrupt.on_second_signal(at_once):
        error: BaseException | None = None
        try:
            for phase in phases:
                if not phase.wanted(ctx):
                    continue
                clock.name, clock.started, clock.open = phase.name, time.monotonic(), True
                try:
                    with ctx.step(phase.name):
                        phase.run(ctx)
                finally:
                    clock.open = False
                    ctx.record_phase(phase.name, clock.seconds())
            clock.name = None
            ctx.record_end(None, None)
        except BaseException as exc:
            error = exc
            ctx.record_end(exc, clock.name)
            raise
        finally:
            with interrupt.deferred():
                ctx.write_report()
                ctx.teardown(error)


def ended_by_signal(error: BaseException | None) -> str | None:
    """The signal's name when `error` is an interrupt (Ctrl-C, SIGTERM, SIGHUP), else None."""
    return interrupt.signal_of(error) if isinstance(error, KeyboardInterrupt) else None
