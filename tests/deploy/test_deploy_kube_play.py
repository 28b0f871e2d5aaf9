"""The ci profile's rendered objects played by `podman kube play` on this machine, judged by `forge smoke
--endpoint` at the router, and torn down with `podman kube down`, nothing left.

What Podman 4.3 does with them (docs/deploy.md): it runs the Deployments' pods (one per Deployment, whatever
`replicas` says), mounts the ConfigMaps, and reads a secretKeyRef from a Podman secret in its own format (a
JSON map of base64 values: the Secret object it stores from `kube play` it cannot read back, so this test
creates that secret itself). Services, PodDisruptionBudgets and the readiness and startup probes have no
effect; the liveness probe becomes a healthcheck that needs systemd timers, absent here. So pod networking
and DNS discovery are not exercised here (--network host: the router lists the replicas by port); they stay
proven by the schema tests and tests/router/test_router_discovery.py.

Minutes (two vLLM replicas start), so not in CI's default run: `nox -s kube-play` sets FORGE_KUBE_PLAY=1.
It has not passed here yet: Podman 4.3 gives each pod 64 MiB of /dev/shm and vLLM asks 160 MiB (docs/deploy.md).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from builders.cli import main
from builders.deploy.command import load_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "smoke"))
from smoke_helpers import router_image, smoke_image

ROOT = Path(__file__).resolve().parents[2]
BASE_PORT = 18700
INSTANCE = "forge-ci"

pytestmark = [
    pytest.mark.engine,
    pytest.mark.server,
    pytest.mark.skipif(os.environ.get("FORGE_KUBE_PLAY") != "1", reason="minutes: run by `nox -s kube-play`"),
    pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman"),
]


def podman(*args: str, check: bool = True, input_bytes: bytes | None = None) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, input=input_bytes, timeout=600, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.stderr.decode(errors='replace')[-2000:]}")
    return done.stdout.decode(errors="replace")


def in_podman(image: str) -> str:
    """The image under Podman's name for it, copied from Docker when Podman lacks it or holds another build."""
    docker_id = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True, check=True
    ).stdout.strip()
    first = image.split("/", 1)[0]
    # Podman names an image without a registry part localhost/NAME once loaded.
    name = image if "/" in image and ("." in first or ":" in first or first == "localhost") else f"localhost/{image}"
    have = podman("image", "inspect", "-f", "{{.Id}}", name, check=False).strip()
    if have.removeprefix("sha256:") != docker_id.removeprefix("sha256:"):
        saved = subprocess.run(["docker", "save", image], capture_output=True, check=True).stdout
        podman("load", input_bytes=saved)
    return name


def leftovers() -> list[str]:
    pods = podman("pod", "ps", "--format", "{{.Name}}").split()
    containers = podman("ps", "-a", "--format", "{{.Names}}").split()
    secrets = podman("secret", "ls", "--format", "{{.Name}}").split()
    return [n for n in (*pods, *containers, *secrets) if n.startswith(INSTANCE)]


@pytest.fixture
def played(tmp_path: Path) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    vllm, router = in_podman(smoke_image()), in_podman(router_image())
    out = tmp_path / "ci"
    argv = ["--root", str(ROOT), "deploy", "render", "--profile", "ci", "--network", "host"]
    argv += ["--base-port", str(BASE_PORT), "--image", vllm, "--router-image", router, "-o", str(out)]
    assert main(argv) == 0
    objects = load_dir(out)
    secret = next(o for o in objects if o["kind"] == "Secret")
    play = tmp_path / "play.yaml"
    play.write_text(yaml.safe_dump_all([o for o in objects if o["kind"] != "Secret"]))
    keys = {k: base64.b64encode(v.encode()).decode() for k, v in secret["stringData"].items()}
    assert leftovers() == [], "a previous run left pods behind"
    started = time.monotonic()
    try:
        podman("secret", "create", secret["metadata"]["name"], "-", input_bytes=json.dumps(keys).encode())
        podman("kube", "play", str(play))
        yield f"http://127.0.0.1:{BASE_PORT}", secret["stringData"]["api-key"], objects
    finally:
        podman("kube", "down", str(play), check=False)
        podman("secret", "rm", secret["metadata"]["name"], check=False)
        print(f"kube play to kube down: {time.monotonic() - started:.0f}s")
    assert leftovers() == []


def test_the_ci_profile_played_by_podman_passes_its_gates_through_the_endpoint(
    played: tuple[str, str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    url, key, _ = played
    # Four times the profile's startup bound: on this shared 2-core machine under a load average of 15-20 (other
    # builds, smoke runs and sweeps beside it) the replicas had not answered /health after 10 minutes.
    deadline = time.monotonic() + 4 * 300
    serving: dict[str, bool] = {}
    while time.monotonic() < deadline:
        try:
            serving = requests.get(f"{url}/health", timeout=2).json()["pool_serving"]
        except (requests.RequestException, ValueError, KeyError):
            serving = {}
        if serving and all(serving.values()):
            break
        time.sleep(2)
    if serving != {"interactive": True, "bulk": True}:
        logs = {
            n: podman("logs", "--tail", "15", n, check=False) for n in podman("ps", "--format", "{{.Names}}").split()
        }
        raise AssertionError(f"not serving: {serving}\n{podman('ps', '-a')}\n{json.dumps(logs, indent=1)}")
    report_dir = tmp_path / "report"
    argv = ["--root", str(ROOT), "smoke", "--endpoint", url, "--profile", "ci", "--api-key", key]
    assert main([*argv, "--report", str(report_dir)]) == 0
    report = json.loads(next(report_dir.glob("smoke-endpoint-*.json")).read_text())
    assert report["gates"]["passed"]
    ports = {"interactive": BASE_PORT + 1, "bulk": BASE_PORT + 2}
    for name, row in report["traffic"]["main"]["classes"].items():
        assert set(row["served_where"]) == {f"{row['pool']}/http://127.0.0.1:{ports[row['pool']]}"}, name
