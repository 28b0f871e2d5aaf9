"""Helpers of the end-to-end smoke tests: free ports, leftover processes, driving `forge smoke` and Ctrl-C."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def local_vllm() -> Path:
    binary = os.environ.get("FORGE_LOCAL_VLLM")
    if not binary:
        pytest.skip("set FORGE_LOCAL_VLLM to a `vllm` executable (e.g. /work/cache/venv-vllm/bin/vllm)")
    return Path(binary)


def smoke_image() -> str:
    image = os.environ.get("FORGE_SMOKE_IMAGE")
    if not image:
        pytest.skip("set FORGE_SMOKE_IMAGE to a built vLLM image tag (e.g. forge/debian-12-vllm-wheel:test)")
    return image


def free_base_port(count: int) -> int:
    """A base port with `count` free ports after it, away from the profiles' defaults."""
    for _ in range(50):
        base = random.randrange(30000, 60000)
        try:
            for port in range(base, base + count + 1):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free loopback port range found")


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes containing `text` (the run id is in every path a run uses)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def interrupt_forge_smoke(args: list[str], sig: signal.Signals, *, after_s: float) -> tuple[int, str, str]:
    """Start `forge smoke ARGS`, send `sig` `after_s` seconds after its replicas start, and wait for it.

    Returns the exit code, the run id it printed and its whole output.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "builders.cli", "smoke", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert process.stdout is not None
    output: list[str] = []
    run_id = ""
    deadline = time.monotonic() + 300
    try:
        for line in process.stdout:
            output.append(line)
            found = re.search(r"replica\(s\) \(run ([0-9a-f]+)\)", line)
            if found:
                run_id = found.group(1)
                break
            if time.monotonic() > deadline:
                break
        assert run_id, "forge smoke never started replicas:\n" + "".join(output)
        time.sleep(after_s)
        process.send_signal(sig)
        rest, _ = process.communicate(timeout=120)
        output.append(rest)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, run_id, "".join(output)
