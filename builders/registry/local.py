"""A real registry on loopback for CI and tests: Debian's `docker-registry` (CNCF distribution 2.8).

One way to start it, used by `.ci/run` (`python -m builders.registry.local --port 5000 DIR`) and by the test
fixtures (`with local_registry(DIR) as ref: ...`), so the two cannot drift apart.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from builders.errors import ForgeError

BINARY = "docker-registry"


class RegistryNotStarted(ForgeError):
    exit_code = 19
    kind = "registry not started"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_config(root: Path, port: int) -> Path:
    """Storage under root, listening on 127.0.0.1 only, deletes allowed (tests remove what they pushed)."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn, accesslog: {disabled: true}}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
    )
    return config


def start(root: Path, port: int) -> subprocess.Popen[bytes]:
    """Start the registry and wait until /v2/ answers; the caller stops it."""
    binary = shutil.which(BINARY)
    if binary is None:
        raise RegistryNotStarted(
            f"`{BINARY}` is not installed", hint="apt-get install docker-registry (Debian's CNCF distribution 2.8)"
        )
    config = write_config(root, port)
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code == 200:
                return proc
        time.sleep(0.2)
    stop(proc)
    tail = (root / "registry.log").read_text(errors="replace").strip().splitlines()[-5:]
    raise RegistryNotStarted(f"{BINARY} did not answer on 127.0.0.1:{port}: " + " | ".join(tail))


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def local_registry(root: Path, port: int | None = None) -> Iterator[str]:
    """A running registry for the block; yields its host:port."""
    port = port or free_port()
    proc = start(root, port)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m builders.registry.local", description=__doc__)
    parser.add_argument("root", type=Path, help="folder for the registry's config and storage")
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args(argv)
    try:
        proc = start(args.root.resolve(), args.port)
    except ForgeError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    print(f"registry 127.0.0.1:{args.port} pid {proc.pid} storage {args.root / 'data'}", flush=True)
    try:
        return proc.wait()
    finally:
        stop(proc)


if __name__ == "__main__":
    sys.exit(main())
