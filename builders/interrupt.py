"""Ctrl-C, SIGTERM and SIGHUP end a command one way: the way Ctrl-C always has.

CI systems, `timeout`, systemd and Kubernetes stop a job with SIGTERM, and a background job in a script cannot
even receive SIGINT; a closed terminal sends SIGHUP. While `handled()` is in force (the `forge` CLI runs every
command under it), the first of these signals raises `Interrupted`, a KeyboardInterrupt, in the main thread, so
the code that already unwinds Ctrl-C (the build loop, the smoke teardown) stops the engine's build or
containers and writes its report as interrupted. The command then exits 128 + the signal's number.

A second signal ends at once: the hooks registered with `on_second_signal` (kill the build client, kill the
stack's servers) run without grace and the process exits with that same code, skipping whatever cleanup was
still waiting. Reports are written before the slow part of cleanup starts, so they are true even then.

A signal that was ignored when Forge started (`nohup`, a shell's background job) stays ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code(signum: int) -> int:
    """The shell's convention for a command ended by a signal: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP."""
    return 128 + signum


class Interrupted(KeyboardInterrupt):
    """The command was asked to stop by a signal; everything that handles Ctrl-C handles this."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(self.signal_name)

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


def signal_of(exc: KeyboardInterrupt) -> str:
    """The signal's name; a plain KeyboardInterrupt is Python's own Ctrl-C."""
    return exc.signal_name if isinstance(exc, Interrupted) else "SIGINT"


def exit_code_of(exc: KeyboardInterrupt) -> int:
    return exc.exit_code if isinstance(exc, Interrupted) else exit_code(signal.SIGINT)


@dataclass
class _State:
    received: list[int] = field(default_factory=list)
    hooks: list[Callable[[], None]] = field(default_factory=list)
    deferring: int = 0
    pending: int | None = None  # a first signal that arrived while deferred: raised when the deferral ends

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) > 1:
            self.end_now(signum)
        if self.deferring:
            self.pending = signum
            return
        raise Interrupted(signum)

    def end_now(self, signum: int) -> None:
        name = signal.Signals(signum).name
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"\nforge: second signal ({name}): ending now, without waiting for cleanup\n")
            sys.stderr.flush()
        for hook in reversed(self.hooks):
            with contextlib.suppress(Exception):
                hook()
        os._exit(exit_code(signum))


_state: _State | None = None


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Treat SIGTERM and SIGHUP as Ctrl-C, and make a second signal final, until the block ends. Nested use is
    the outer one's; outside the main thread (where Python cannot take signals) it installs nothing."""
    global _state
    if _state is not None:
        yield
        return
    state = _State()
    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in SIGNALS:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN:
                continue
            previous[sig] = current
            signal.signal(sig, state.handle)
    except ValueError:  # not the main thread
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        yield
        return
    _state = state
    try:
        yield
    finally:
        _state = None
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def first_signal() -> str | None:
    """The name of the signal that is ending this command, for a hook that records it."""
    state = _state
    return signal.Signals(state.received[0]).name if state is not None and state.received else None


@contextlib.contextmanager
def on_second_signal(hook: Callable[[], None]) -> Iterator[None]:
    """While the block runs, a second signal calls `hook` (quick, without grace) before the process exits."""
    state = _state
    if state is None:
        yield
        return
    state.hooks.append(hook)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            state.hooks.remove(hook)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Cleanup that must not be cut short by a first signal (a teardown bounded in time): the signal is held and
    raised when the block ends. A second signal still ends at once."""
    state = _state
    if state is None:
        yield
        return
    state.deferring += 1
    try:
        yield
    finally:
        state.deferring -= 1
    if not state.deferring and state.pending is not None:
        signum, state.pending = state.pending, None
        raise Interrupted(signum)
