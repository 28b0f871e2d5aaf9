"""Engine-backed: `forge build` stopped from outside (SIGTERM, as CI cancellation, `timeout` and Kubernetes send it)
in the middle of its build phase leaves a true report, no stale file, no container, no tag, and exits 143."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from builders.container import Engine
from builders.container.docker_engine import DockerEngine
from builders.report import BuildReport, ImageRecord

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
EARLIER = "from an earlier build"

# Docker's builders (BuildKit's CLI, the engine API's legacy builder): the extra `forge build` arguments and
# environment that select the engine. Podman's buildah has a case of its own below, read through its CLI.
ENGINES = [pytest.param([], {}, id="docker")]


def _plant_earlier_build(folder: Path) -> None:
    """What a finished build leaves (report, summary, SBOM, logs, Containerfile), and a file that is the user's."""
    folder.mkdir(parents=True)
    earlier = BuildReport(distro="debian-12", target="router", recipe="router", result="succeeded")
    earlier.started, earlier.error = "2020-01-01T00:00:00Z", EARLIER
    earlier.image = ImageRecord(id="sha256:" + "e" * 64, tags=["forge/debian-12-router:old"], size=1)
    earlier.write(folder)
    for name in ("sbom.cdx.json", "build.log", "toolchain.log", "Containerfile"):
        (folder / name).write_text(f"{name} {EARLIER}\n")
    (folder / "notes.txt").write_text("the user's own file\n")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _client(engine: Engine) -> Any:
    """Docker's SDK client: these cases read the legacy builder's intermediate images, which only Docker has."""
    assert isinstance(engine, DockerEngine), "the interruption cases run on Docker (ENGINES)"
    return engine.client


def _intermediate_layers(engine: Engine, before: set[str], base_id: str) -> list[str]:
    """Untagged images made since `before` on top of the base: the legacy builder keeps each finished step of a
    build as a cache image, a cancelled one too. Leaves first, so removing them in order succeeds."""
    found = []
    for image in _client(engine).images.list(all=True):
        if image.id in before or image.tags:
            continue
        parent = image.attrs.get("Parent") or ""
        chain = [image.id]
        while parent and parent != base_id and parent not in before:
            chain.append(parent)
            parent = _client(engine).images.get(parent).attrs.get("Parent") or ""
        if parent == base_id:
            found.append((len(chain), image.id))
    return [image_id for _, image_id in sorted(found, reverse=True)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(300)
# Twice: the second SIGTERM, sent while the first is still stopping the build client, ends Forge at once.
def _signal_mid_build(
    extra: list[str], reports: Path, scratch: Path, tag: str, *, signals: int = 1, env: dict[str, str] | None = None
) -> tuple[int, str, list[int]]:
    """`forge build debian-12 router --no-cache`, sent SIGTERM (`signals` times) a second after its first
    `RUN apt-get update` starts; returns the exit code, all it printed and the build clients it had then.

    --no-cache on the cheapest image: that RUN downloads a compiler from Debian's archive for many seconds, so
    the signal always lands in the build phase."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "builders.cli", "build", "debian-12", "router", "--no-cache", "--skip-preflight",
         "--tag", tag, "--report-dir", str(reports), "--scratch-dir", str(scratch), *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None
    output: list[str] = []
    try:
        for line in proc.stdout:
            output.append(line)
            # BuildKit's `#5 [toolchain 2/6] RUN`, the legacy builder's `Step 3/9 : RUN`, buildah's `STEP 4/9: RUN`.
            if re.search(r"(\] |Step \d+/\d+ : |STEP \d+/\d+: )RUN apt-get update", line):
                break
        assert proc.poll() is None, "".join(output)
        time.sleep(1)
        clients = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        if signals == 2:
            time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
        output.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(output), clients


@pytest.mark.parametrize(("builder", "signals"), [("buildkit", 1), ("legacy", 1), ("buildkit", 2)])
@pytest.mark.parametrize(("engine_args", "engine_env"), ENGINES)
def test_sigterm_mid_build_leaves_a_true_report_and_nothing_else(
    engine: Engine, tmp_path: Path, engine_args: list[str], engine_env: dict[str, str], builder: str, signals: int
) -> None:
    reports, scratch = tmp_path / "reports", tmp_path / "scratch"
    _plant_earlier_build(reports)
    scratch.mkdir()
    tag = "forge/test-router:sigterm"
    engine.remove_image(tag)
    latest_before = (
        engine.image_info("forge/test-router:latest").id if engine.image_exists("forge/test-router:latest") else None
    )
    containers_before = {c.id for c in _client(engine).containers.list(all=True)}
    images_before = {i.id for i in _client(engine).images.list(all=True, filters={"label": "dev.forge.recipe=router"})}
    every_image_before = {i.id for i in _client(engine).images.list(all=True)}
    try:
        code, text, clients = _signal_mid_build(
            ["--builder", builder, *engine_args], reports, scratch, tag, signals=signals, env=engine_env
        )
    finally:
        for layer in _intermediate_layers(engine, every_image_before, engine.image_info("forge/base:debian-12").id):
            engine.remove_image(layer)

    assert code == 143, text
    if signals == 1:
        assert "forge: interrupted by SIGTERM (exit 143)" in text
    else:
        assert "forge: second signal (SIGTERM): ending now" in text
    report = json.loads((reports / "report.json").read_text())
    assert report["result"] == "interrupted" and report["signal"] == "SIGTERM", report
    assert report["ended_in"] == "build" and "build" in report["phases"]
    assert report["image"] == {} and report["sbom"] is None
    assert ("a second signal ended Forge before its cleanup" in report["error"]) == (signals == 2)
    assert report["started"] != "2020-01-01T00:00:00Z"
    summary = (reports / "summary.txt").read_text()
    assert summary.startswith("forge build debian-12 router: INTERRUPTED") and "ended in: build" in summary
    assert "image: none" in summary

    # Nothing of the earlier build is left beside this one's report; the user's own file is.
    assert sorted(p.name for p in reports.iterdir()) == [
        "Containerfile",
        "build.log",
        "notes.txt",
        "report.json",
        "summary.txt",
    ]
    assert not [p.name for p in reports.iterdir() if EARLIER in p.read_text()]
    log = (reports / "build.log").read_text()
    assert "RUN apt-get update" in log
    if signals == 1:
        assert log.rstrip().endswith("interrupted by SIGTERM during build")
    # The staged build context went too, also when the second signal skipped the rest of the cleanup.
    assert list(scratch.iterdir()) == []

    # The engine's build was stopped: its client is gone (BuildKit's is a process; the legacy builder's is this
    # process's connection), no image was made, nothing was tagged or left running.
    assert bool(clients) == (builder == "buildkit")
    assert not [pid for pid in clients if _alive(pid)]
    assert not engine.image_exists(tag)
    latest_after = (
        engine.image_info("forge/test-router:latest").id if engine.image_exists("forge/test-router:latest") else None
    )
    assert latest_after == latest_before
    images_after = {i.id for i in _client(engine).images.list(all=True, filters={"label": "dev.forge.recipe=router"})}
    assert not [i for i in images_after - images_before if not engine.image_info(i).tags]
    # The engine removes a cancelled legacy build's step container itself, a moment after the connection closed.
    deadline = time.monotonic() + (30 if builder == "legacy" else 0)
    while True:
        left = [
            c.name
            for c in _client(engine).containers.list(all=True)
            if c.status in {"created", "exited"} and c.id not in containers_before
        ]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    assert not left


def _podman_ids(*args: str) -> set[str]:
    out = subprocess.run(["podman", *args, "--format", "{{.ID}}"], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_sigterm_mid_podman_build_leaves_a_true_report_and_nothing_else(tmp_path: Path) -> None:
    """The same promise on Podman, whose builds are `podman build` (buildah) processes: the signal stops that
    process, and neither a buildah working container nor a tag nor a dangling image of this build is left."""
    sys.path.insert(0, str(ROOT / "tests" / "smoke"))
    from smoke_helpers import podman_base

    podman_base()
    reports, scratch = tmp_path / "reports", tmp_path / "scratch"
    _plant_earlier_build(reports)
    scratch.mkdir()
    tag = "forge/test-router:sigterm-podman"
    containers_before = _podman_ids("ps", "-a") | _podman_ids("ps", "-a", "--external")
    images_before = _podman_ids("images", "-a")
    code, text, builds = _signal_mid_build(["--engine", "podman"], reports, scratch, tag)

    assert code == 143, text
    assert "forge: interrupted by SIGTERM (exit 143)" in text
    report = json.loads((reports / "report.json").read_text())
    assert report["result"] == "interrupted" and report["ended_in"] == "build", report
    assert report["engine"]["kind"] == "podman" and report["image"] == {}
    assert sorted(p.name for p in reports.iterdir()) == [
        "Containerfile",
        "build.log",
        "notes.txt",
        "report.json",
        "summary.txt",
    ]
    assert list(scratch.iterdir()) == []
    # `podman build` was this process's child, and is gone with its working containers and layers.
    assert builds and not [pid for pid in builds if _alive(pid)]
    assert subprocess.run(["podman", "image", "exists", f"localhost/{tag}"], check=False).returncode != 0, "tagged"
    left = (_podman_ids("ps", "-a") | _podman_ids("ps", "-a", "--external")) - containers_before
    assert left == set(), left
    # Steps finished before the signal stay as untagged layers, buildah's cache, as Docker's legacy builder keeps
    # its own (the Docker cases remove theirs too): nothing of this build has a name.
    new_images = sorted(_podman_ids("images", "-a") - images_before)
    if new_images:
        names = subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.RepoTags}}", *new_images],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        subprocess.run(["podman", "rmi", "--force", *new_images], capture_output=True, check=False)
        assert set(names) <= {"[]"}, names
