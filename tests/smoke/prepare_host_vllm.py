"""Fill the host-process replicas' vLLM venv ahead of the tests that need it: `nox -s suite` starts this in the
background at its first step.

The venv is a 3.5 GB pip install from an 0.9 GB wheelhouse download, mostly one core's work and the network's;
made by the first server-backed test that needs it, it cost that test two of its three and a half minutes, with
the second core idle. Started here, it overlaps the engine setup, the linters and the first builds, which wait
on apt, the registry and single-threaded layer commits. It changes no test: the tests get the same venv (the one
function, under a lock, smoke_helpers.local_vllm), and if this fails they make it themselves and fail
with its error.

A host with little disk keeps the old order (skip below MIN_FREE_GB): the venv made early sits on disk through
the suite's peak, the big images' tests (README: 13-14 GB at peak).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smoke_helpers import ROOT, host_venv_path, host_venv_ready, local_vllm

MIN_FREE_GB = 30


def main() -> int:
    if os.environ.get("FORGE_LOCAL_VLLM"):
        print("prepare-host-vllm: FORGE_LOCAL_VLLM is set; the tests use that vLLM")
        return 0
    venv = host_venv_path()
    probe = venv if venv.exists() else ROOT
    free_gb = shutil.disk_usage(probe).free / 2**30
    if not host_venv_ready(venv) and free_gb < MIN_FREE_GB:
        print(f"prepare-host-vllm: {free_gb:.0f} GB free (< {MIN_FREE_GB}); the first test that needs it makes it")
        return 0
    start = time.monotonic()
    made = local_vllm()
    print(f"prepare-host-vllm: {made} ready after {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
