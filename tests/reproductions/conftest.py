"""A second, deliberately small Docker engine: the "Debian needs a larger rootfs" failure, made on purpose."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.engine import Engine

SMALL_ENGINE_MB = 2500


@pytest.fixture
def small_engine(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """dockerd whose data root is a 2.5 GB tmpfs, on its own socket, removed with everything in it afterwards."""
    if shutil.which("dockerd") is None:
        pytest.fail("dockerd is not installed (apt-get install docker.io, as .ci/run does)")
    root = Path("/var/tmp") / f"forge-small-engine-{os.getpid()}"
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_ENGINE_MB}m", "tmpfs", str(data)], check=True)
    sock = root / "docker.sock"
    log = (root / "dockerd.log").open("w")
    proc = subprocess.Popen(
        [
            "dockerd",
            "--bridge=none",
            "--iptables=false",
            f"--data-root={data}",
            f"--exec-root={root / 'exec'}",
            f"--pidfile={root / 'dockerd.pid'}",
            f"--host=unix://{sock}",
            "--containerd-namespace=forge-small",
            "--containerd-plugins-namespace=forge-small-plugins",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
        deadline = time.monotonic() + 60
        engine: Engine | None = None
        while time.monotonic() < deadline and engine is None:
            try:
                engine = Engine.connect()
            except Exception:  # not up yet
                time.sleep(1)
        if engine is None:
            pytest.fail("the small dockerd did not start:\n" + (root / "dockerd.log").read_text()[-2000:])
        yield engine
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        subprocess.run(["umount", "-l", str(data)], check=False)
        shutil.rmtree(root, ignore_errors=True)
