"""Proof that what CI pushed is what a deployment runs: push the built cpu-wheel image to a real registry, then
on a second Docker engine that has no images at all, `forge smoke REGISTRY/NAME@sha256:…` pulls exactly that
digest and serves the CI profile through the router.

Run by `nox -s pull-smoke` (not in CI: the pull and the smoke take minutes). Leaves nothing behind: the second
engine, its data root and the registry are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from builders.container.docker_engine import DockerEngine
from builders.registry.local import local_registry

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def empty_engine(root: Path) -> Iterator[str]:
    """A dockerd of its own (data root, socket, containerd namespace), with no image in it; yields DOCKER_HOST."""
    sock = root / "docker.sock"
    log = (root / "dockerd.log").open("w")
    proc = subprocess.Popen(
        [
            "dockerd",
            "--bridge=none",
            "--iptables=false",
            f"--data-root={root / 'data'}",
            f"--exec-root={root / 'exec'}",
            f"--pidfile={root / 'dockerd.pid'}",
            f"--host=unix://{sock}",
            "--containerd-namespace=forge-pull-smoke",
            "--containerd-plugins-namespace=forge-pull-smoke-plugins",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    host = f"unix://{sock}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if subprocess.run(["docker", "-H", host, "info"], capture_output=True).returncode == 0:
                break
            time.sleep(1)
        else:
            raise SystemExit("the second dockerd did not start:\n" + (root / "dockerd.log").read_text()[-2000:])
        yield host
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextmanager
def given(registry: str) -> Iterator[str]:
    yield registry


def forge(*args: str, env: dict[str, str] | None = None) -> None:
    print("+ forge " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "builders.cli", *args], check=True, cwd=ROOT, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--report-dir", type=Path, default=ROOT / "reports" / "debian-12-cpu-wheel")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--registry", default=None, help="HOST:PORT of a running registry (default: start one)")
    parser.add_argument(
        "--startup-s", type=float, default=None, help="the profile's timeouts.startup_s, raised on a busy machine"
    )
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="forge-pull-smoke-", dir="/var/tmp"))
    try:
        reports = scratch / "report"
        shutil.copytree(args.report_dir, reports)  # the push records itself in this copy, not in the build's
        profile = args.profile
        if args.startup_s is not None:
            data = yaml.safe_load((ROOT / "profiles" / f"{args.profile}.yaml").read_text())
            data.setdefault("timeouts", {})["startup_s"] = args.startup_s
            profile = str(scratch / f"{args.profile}.yaml")
            Path(profile).write_text(yaml.safe_dump(data))
        with given(args.registry) if args.registry else local_registry(scratch / "registry") as registry:
            ref = f"{registry}/forge/debian-12-cpu-wheel:pull-smoke"
            start = time.monotonic()
            forge("push", "debian-12", "cpu-wheel", ref, "--report-dir", str(reports))
            pushed = json.loads((reports / "report.json").read_text())["push"]
            print(f"pushed {pushed['pull']} in {time.monotonic() - start:.0f} s", flush=True)
            (scratch / "engine").mkdir()
            with empty_engine(scratch / "engine") as host:
                env = {**os.environ, "DOCKER_HOST": host}
                os.environ["DOCKER_HOST"] = host
                # A second dockerd: the script drives Docker's SDK, the one engine it starts.
                images = DockerEngine.open().client.images.list(all=True)
                assert not images, f"the second engine is not empty: {images}"
                del os.environ["DOCKER_HOST"]
                start = time.monotonic()
                forge("smoke", pushed["pull"], "--profile", profile, "--report", str(scratch / "smoke"), env=env)
                print(f"smoke of {pushed['pull']} on an empty engine passed in {time.monotonic() - start:.0f} s")
        return 0
    finally:
        # dockerd leaves its network namespace mounted under the exec root; rmtree cannot remove it otherwise.
        subprocess.run(
            ["umount", "-l", str(scratch / "engine" / "exec" / "netns" / "default")], capture_output=True, check=False
        )
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
