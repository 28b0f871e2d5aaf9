"""The cache lock between processes: a second holder waits, a killed holder frees it, and a wheelhouse fetch
runs under it (CI fills the host's vLLM venv beside builds that fetch the same wheelhouse)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builders import sources
from builders.locks import exclusive
from builders.project import Project

ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, time
from pathlib import Path
from builders.locks import exclusive
with exclusive(Path(sys.argv[1])):
    print("held", time.time(), flush=True)
    time.sleep(float(sys.argv[2]))
print("released", time.time(), flush=True)
"""


def _holder(lock: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(seconds)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("held")
    return proc


def test_a_second_process_waits_until_the_first_lets_go(tmp_path: Path) -> None:
    lock = tmp_path / "cache.lock"
    first = _holder(lock, 1.5)
    with exclusive(lock):
        got = time.time()
    assert first.stdout is not None
    released = float(first.stdout.readline().split()[1])
    first.wait(timeout=10)
    assert got >= released - 0.05, (got, released)


def test_a_killed_holder_leaves_no_lock_behind(tmp_path: Path) -> None:
    lock = tmp_path / "cache.lock"
    holder = _holder(lock, 60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    start = time.monotonic()
    with exclusive(lock):
        pass
    assert time.monotonic() - start < 5


def test_a_wheelhouse_fetch_holds_the_wheelhouse_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "cache"))
    project = Project.load(ROOT)
    distro, recipe = project.distro("debian-12"), project.recipe_for("cpu-wheel")
    dest = sources.wheelhouse_dir(ROOT, distro, recipe)
    seen: list[bool] = []

    def fetch(_recipe: object, _distro: object, folder: Path, _say: object) -> Path:
        # Another open file description of the same lock file: flock refuses it while the fetch holds the lock.
        with (folder.parent / f"{folder.name}.lock").open("a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                seen.append(True)
            else:
                seen.append(False)
        return folder

    monkeypatch.setattr(sources, "_fetch_wheelhouse", fetch)
    assert sources.fetch_wheelhouse(recipe, distro, ROOT) == dest
    assert seen == [True]
    # And released after: the next fetch (another process's) gets it at once.
    with (dest.parent / f"{dest.name}.lock").open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
