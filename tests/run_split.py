"""The whole suite as two pytest runs at once: the engine-free tests beside the engine- and server-backed ones.

The engine-free part takes about 7 minutes of wall time but only 3 of CPU (it waits on sockets, subprocesses and
timers); the engine part spends most of its 40 minutes waiting on builds and servers too. Run one after the other
they cost their sum; side by side, the engine-free part hides inside the first builds. Each test already has to hold
on a loaded host (issue 34), so running them beside a build changes no verdict, only the clock.

The engine part's output streams to the terminal; the engine-free part's goes to a file that is printed when it
ends, so neither log interleaves with the other. The exit status is the worse of the two.

A skip (or xfail) among the engine- and server-backed tests fails the run unless tests/allowed_skips.toml excuses
it (tests/skip_policy.py): a proof that did not run is not a proof that passed. Under CI (FORGE_CI=1, set by
.ci/run) only the entries marked `ci = true` do. FORGE_ALLOWED_SKIPS names another allow-list.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from skip_policy import ALLOWED_SKIPS, AllowListError, load_allowed, unexcused

# Builds under emulation are long proofs with nox sessions of their own (publish-multiplatform), not suite tests.
ENGINE_FREE = "not engine and not server and not emulation"
ENGINE_BACKED = "(engine or server) and not emulation"


def _pytest(marker: str, basetemp: Path, extra: list[str]) -> list[str]:
    # A base temp of its own: two pytest processes sharing /tmp/pytest-of-root would prune each other's dirs.
    return [sys.executable, "-m", "pytest", "-m", marker, f"--basetemp={basetemp}", "-p", "no:cacheprovider", *extra]


def main(argv: list[str]) -> int:
    ci = os.environ.get("FORGE_CI") == "1"
    try:
        # Read before anything runs: a broken allow-list should cost seconds, not the suite's 40 minutes.
        allowed = load_allowed(Path(os.environ.get("FORGE_ALLOWED_SKIPS") or ALLOWED_SKIPS))
    except AllowListError as exc:
        print(f"== {exc}", flush=True)
        return 2
    work = Path(tempfile.mkdtemp(prefix="forge-suite-"))
    junit = work / "engine.xml"
    log_path = work / "engine-free.log"
    started = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        free = subprocess.Popen(
            _pytest(ENGINE_FREE, work / "free", argv), stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()
        )
        try:
            engine_code = subprocess.call(_pytest(ENGINE_BACKED, work / "engine", [f"--junitxml={junit}", *argv]))
        finally:
            free_code = free.wait()
    print(f"\n== the engine-free tests (run beside the engine-backed ones; {log_path}):", flush=True)
    sys.stdout.write(log_path.read_text(encoding="utf-8", errors="replace"))
    took = time.monotonic() - started
    print(
        f"== engine-backed pytest exited {engine_code}, engine-free pytest exited {free_code} ({took:.0f} s)",
        flush=True,
    )
    skip_code = 0
    if junit.exists():
        for skip in unexcused(junit, allowed, ci=ci):
            how = "xfailed" if skip.kind == "pytest.xfail" else "skipped"
            print(f"== not excused: {skip.test} {how} ({skip.raised_in}): {skip.reason}", flush=True)
            skip_code = 1
    elif engine_code == 0:
        print(f"== the engine-backed pytest wrote no {junit}: its skips cannot be judged", flush=True)
        skip_code = 1
    if skip_code:
        where = os.environ.get("FORGE_ALLOWED_SKIPS") or ALLOWED_SKIPS
        print(f"== an engine- or server-backed test did not run: fix the host, or the test (allow-list: {where})")
    # pytest's 5 (no test collected) is a failure here: each half has tests, and finding none means a broken filter.
    return max(engine_code, free_code, skip_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
