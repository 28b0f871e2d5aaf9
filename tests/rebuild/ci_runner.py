"""What the CI-cache engine test needs besides the engine: a real Redis on loopback (Debian's redis-server), a second
"runner" whose storage starts empty (a dockerd of its own, or Podman on a storage root of its own), and a scan of
every byte an image carries."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.container import Engine, connect
from builders.registry.local import free_port


@contextlib.contextmanager
def redis_server(root: Path, password: str) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """redis-server on 127.0.0.1 with a password, no persistence; yields (port, process) and stops it."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server, as .ci/engines does)")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (root / "redis.log").open("wb")
    # The password on the command line is this test's own throwaway; a process list is not an output of Forge.
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--requirepass",
            password,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(root),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("redis-server did not start: " + (root / "redis.log").read_text(errors="replace")[-500:])
            time.sleep(0.1)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()


@contextlib.contextmanager
def fresh_podman(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """Podman on a storage root of its own: no image, no layer, no build cache of the main one."""
    root.mkdir(parents=True, exist_ok=True)
    conf = root / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n')
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(conf))
    try:
        yield connect("podman")
    finally:
        env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf)}
        subprocess.run(["podman", "rmi", "--all", "--force"], env=env, capture_output=True, check=False)
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for point in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(root, ignore_errors=True)


def _found_in(data: bytes, needles: tuple[bytes, ...]) -> bool:
    if any(n in data for n in needles):
        return True
    # A wheel or a zip keeps its files deflated: look inside.
    if data[:4] == b"PK\x03\x04":
        with contextlib.suppress(zipfile.BadZipFile), zipfile.ZipFile(io.BytesIO(data)) as archive:
            return any(any(n in archive.read(i) for n in needles) for i in archive.infolist())
    return False


def image_holds(engine: Engine, ref: str, needles: tuple[bytes, ...]) -> list[str]:
    """Where in the image's export (manifest, config, every file of every layer) any of the byte strings is."""
    hits: list[str] = []
    stream = engine.save_stream(ref)
    try:
        with tarfile.open(fileobj=stream, mode="r|") as outer:
            for member in outer:
                if not member.isfile():
                    continue
                data = outer.extractfile(member).read()  # type: ignore[union-attr]
                if any(n in data for n in needles) and not member.name.endswith(".tar"):
                    hits.append(member.name)
                if member.name.endswith(".tar") or ("/" in member.name and len(data) > 512):
                    with contextlib.suppress(tarfile.TarError), tarfile.open(fileobj=io.BytesIO(data)) as layer:
                        for item in layer:
                            if item.isfile() and _found_in(layer.extractfile(item).read(), needles):  # type: ignore[union-attr]
                                hits.append(f"{member.name}:{item.name}")
                            if any(n in (item.name + item.linkname).encode() for n in needles):
                                hits.append(f"{member.name}:{item.name} (name)")
    finally:
        stream.close()
    return hits
