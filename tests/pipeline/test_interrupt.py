"""SIGTERM, SIGHUP and Ctrl-C end a command one way (builders/interrupt.py), in a real child process: the first
unwinds as Ctrl-C with the documented exit code, a second ends at once, an inherited SIG_IGN stays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from builders.report import BuildReport

ROOT = Path(__file__).resolve().parents[2]

# The child: a command under interrupt.handled() that unwinds like the build loop does (an except that records,
# then a slow cleanup in `finally`), registering what a second signal must kill.
CHILD = """
import sys, time
from pathlib import Path
from builders import interrupt
out = Path(sys.argv[1])
cleanup_s = float(sys.argv[2])
try:
    with interrupt.handled():
        with interrupt.on_second_signal(lambda: (out / "hook").write_text("killed")):
            try:
                with interrupt.deferred():
                    print("ready", flush=True)
                    time.sleep(float(sys.argv[3]))  # a signal here waits for the block to end
                print("running", flush=True)
                time.sleep(60)
            except KeyboardInterrupt as exc:
                (out / "first").write_text(interrupt.signal_of(exc))
                raise
            finally:
                time.sleep(cleanup_s)
                (out / "cleaned").write_text("yes")
except KeyboardInterrupt as exc:
    sys.exit(interrupt.exit_code_of(exc))
"""


_started: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_child_left() -> Iterator[None]:
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _child(
    tmp_path: Path, *, cleanup_s: float = 0.0, deferred_s: float = 0.0, preexec: Callable[[], None] | None = None
) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), str(cleanup_s), str(deferred_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        # As a terminal's shell does: the defaults restored, whatever this test runner inherited (a suite started
        # under nohup hands its children SIGHUP ignored, which the last test here shows Forge keeps).
        preexec_fn=preexec or _default_signals,
    )
    _started.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _wait_for_line(proc: subprocess.Popen[str], text: str) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == text


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)], ids=["term", "hup", "int"]
)
def test_each_signal_unwinds_as_ctrl_c_with_its_exit_code(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    proc = _child(tmp_path)
    _wait_for_line(proc, "running")
    proc.send_signal(sig)
    assert proc.wait(timeout=20) == code, proc.stderr.read() if proc.stderr else ""
    assert (tmp_path / "first").read_text() == sig.name
    assert (tmp_path / "cleaned").exists() and not (tmp_path / "hook").exists()


def test_a_second_signal_ends_at_once_after_killing_what_was_registered(tmp_path: Path) -> None:
    proc = _child(tmp_path, cleanup_s=30)
    _wait_for_line(proc, "running")
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not (tmp_path / "first").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 130
    assert time.monotonic() - sent < 5, "the second signal waited for the 30 s cleanup"
    assert (tmp_path / "hook").read_text() == "killed"
    assert not (tmp_path / "cleaned").exists()
    assert proc.stderr is not None and "second signal (SIGINT): ending now" in proc.stderr.read()


def test_a_signal_during_a_deferred_block_is_raised_when_it_ends(tmp_path: Path) -> None:
    proc = _child(tmp_path, deferred_s=1.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    assert proc.stdout is not None and "running" not in proc.stdout.read()
    assert (tmp_path / "first").read_text() == "SIGTERM" and (tmp_path / "cleaned").exists()


def test_a_signal_ignored_at_start_stays_ignored(tmp_path: Path) -> None:
    """`nohup forge build …` must outlive its terminal: an inherited SIG_IGN for SIGHUP is left alone."""

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = _child(tmp_path, preexec=nohup)
    _wait_for_line(proc, "running")
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143


def test_an_interrupted_report_names_the_signal_the_phase_and_no_image(tmp_path: Path) -> None:
    report = BuildReport(distro="debian-12", target="router", recipe="router")
    report.result, report.signal, report.ended_in = "interrupted", "SIGTERM", "build"
    report.error = "interrupted by SIGTERM during build"
    report.phases = {"engine": 0.4, "build": 2.5}
    (tmp_path / ".report.json.new").write_text("a write cut short")
    report.write(tmp_path)
    summary = (tmp_path / "summary.txt").read_text()
    assert "INTERRUPTED" in summary and "ended in: build (2.5s)" in summary
    assert "image: none" in summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "summary.txt"]
