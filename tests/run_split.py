"""The whole suite as two pytest runs at once: the engine-free tests beside the engine- and server-backed ones.

The engine-free part takes about 7 minutes of wall time but only 3 of CPU (it waits on sockets, subprocesses and
timers); the engine part spends most of its 40 minutes waiting on builds and servers too. Run one after the other
they cost their sum; side by side, the engine-free part hides inside the first builds. Each test already has to hold
on a loaded host (issue 34), so running them beside a build changes no verdict, only the clock.

The engine part's output streams to the terminal; the engine-free part's goes to a file that is printed when it
ends, so neither log interleaves with the other. The exit status is the worse of the two.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Builds under emulation are long proofs with nox sessions of their own (publish-multiplatform), not suite tests.
ENGINE_FREE = "not engine and not server and not emulation"
ENGINE_BACKED = "(engine or server) and not emulation"


def _pytest(marker: str, basetemp: Path, extra: list[str]) -> list[str]:
    # A base temp of its own: two pytest processes sharing /tmp/pytest-of-root would prune each other's dirs.
    return [sys.executable, "-m", "pytest", "-m", marker, f"--basetemp={basetemp}", "-p", "no:cacheprovider", *extra]


def main(argv: list[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="forge-suite-"))
    log_path = work / "engine-free.log"
    started = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        free = subprocess.Popen(
            _pytest(ENGINE_FREE, work / "free", argv), stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()
        )
        try:
            engine_code = subprocess.call(_pytest(ENGINE_BACKED, work / "engine", argv))
        finally:
            free_code = free.wait()
    print(f"\n== the engine-free tests (run beside the engine-backed ones; {log_path}):", flush=True)
    sys.stdout.write(log_path.read_text(encoding="utf-8", errors="replace"))
    took = time.monotonic() - started
    print(
        f"== engine-backed pytest exited {engine_code}, engine-free pytest exited {free_code} ({took:.0f} s)",
        flush=True,
    )
    # pytest's 5 (no test collected) is a failure here: each half has tests, and finding none means a broken filter.
    return max(engine_code, free_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
