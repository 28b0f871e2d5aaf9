"""A replica's CPU set reaches the processes: the host-process runtime confines a replica and its children."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from builders.smoke.runtimes import start_process

# The child starts a grandchild, as vLLM starts its engine core and workers: the set must reach both.
REPORT = (
    "import os, subprocess, sys; print('parent', sorted(os.sched_getaffinity(0)), flush=True); "
    "subprocess.run([sys.executable, '-c', 'import os; print(\"child\", sorted(os.sched_getaffinity(0)))'])"
)


def test_a_host_replica_and_what_it_starts_run_only_on_its_cpus(tmp_path: Path) -> None:
    last = max(os.sched_getaffinity(0))
    launched = start_process(
        [sys.executable, "-c", REPORT], name="cpus", env={}, log_path=tmp_path / "log", cpus=frozenset({last})
    )
    deadline = time.monotonic() + 30
    while launched.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    launched.stop()
    assert launched.logs().splitlines() == [f"parent [{last}]", f"child [{last}]"]


def test_without_a_cpu_set_a_process_keeps_every_cpu(tmp_path: Path) -> None:
    launched = start_process([sys.executable, "-c", REPORT], name="cpus", env={}, log_path=tmp_path / "log")
    deadline = time.monotonic() + 30
    while launched.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    launched.stop()
    everything = sorted(os.sched_getaffinity(0))
    assert launched.logs().splitlines() == [f"parent {everything}", f"child {everything}"]
