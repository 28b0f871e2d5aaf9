"""Shared fixtures: the project checkout, an engine for tests marked `engine`, and a deliberately small one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.container import Engine, connect
from builders.container.select import chosen
from builders.gates import common, host
from builders.project import Project
from builders.router.native import ENV_SWITCH, NativeRelay

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def project() -> Project:
    return Project.load(ROOT)


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """A writable copy of distros/, recipes/ and containers/ to break on purpose."""
    for sub in ("distros", "recipes", "containers"):
        shutil.copytree(ROOT / sub, tmp_path / sub)
    return tmp_path


@pytest.fixture
def ample_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Preflight's disk gates read statvfs of the engine's data root and the scratch dir. Tests whose subject is
    another gate pin a roomy disk, so their verdict does not depend on how full the machine running them is (a
    CI machine with under ~35 GB free used to turn their clear/incomplete into blocked)."""
    monkeypatch.setattr(common, "free_bytes", lambda path: (2**40, host.existing_ancestor(path)))


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    from builders.errors import EngineError

    try:
        eng = connect(chosen())
    except EngineError as exc:
        pytest.fail(f"engine-backed test, but no engine answers: {exc.message} (start dockerd as .ci/run does)")
    yield eng


# The "Debian needs a larger rootfs" failure, made on purpose: a second engine on a small filesystem.
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
                engine = connect(chosen())
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
        # Not only the tmpfs: dockerd leaves its default network namespace bind-mounted under the exec root
        # (exec/netns/default), and a folder with a mount in it is not removed: every run left one behind.
        for mount in _mounts_under(root):
            subprocess.run(["umount", "-l", mount], check=False)
        shutil.rmtree(root, ignore_errors=True)
        left = _mounts_under(root)
        if left or root.exists():
            pytest.fail(f"the small dockerd left {root} behind (mounts: {left or 'none'})")


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below root, deepest first (the order they can be unmounted in)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    points = {line.split()[1] for line in mounts if len(line.split()) > 1}
    inside = [p for p in points if p == str(root) or p.startswith(f"{root}/")]
    return sorted(inside, key=lambda p: p.count("/"), reverse=True)


@pytest.fixture(params=["native", "python"])
def each_relay(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a router test once with the C relay and once with the Python one: both must keep every promise.

    The router reads the switch when it is made, so a test using this starts its router after it is set.
    """
    relay: str = request.param
    if relay == "native" and NativeRelay is None:
        pytest.skip("the C relay is not built in this checkout (test_the_c_relay_is_built_where_a_compiler_is)")
    monkeypatch.setenv(ENV_SWITCH, "1" if relay == "native" else "0")
    return relay


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a real registry on 127.0.0.1 (Debian's docker-registry): the one .ci/run started
    (FORGE_TEST_REGISTRY), else one of this session's own, started the same way."""
    from builders.registry.local import local_registry

    given = os.environ.get("FORGE_TEST_REGISTRY")
    if given:
        yield given
        return
    with local_registry(tmp_path_factory.mktemp("registry")) as host:
        yield host


# Big images are released after the last test that uses it, not at the end of the session: the tests that use
# one run together (pytest's file order), and a small CI disk then holds one big image at a time. A test names
# the images it needs with @pytest.mark.image("podman:cpu-wheel", ...) (module-wide through pytestmark).
_IMAGE_USERS = pytest.StashKey[dict[str, set[str]]]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "image(*keys): the session-built images (ENGINE:TARGET) the test uses")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The users of one big image run together, at the place of its last user: the kube-play test (tests/deploy)
    # otherwise held the Podman cpu-wheel image through every test up to tests/smoke, the forced Debian 12
    # source build among them, and that was the suite's disk peak.
    for key in dict.fromkeys(key for item in items for key in sorted(_image_keys(item))):
        marked = [i for i, item in enumerate(items) if key in _image_keys(item)]
        if len(marked) > 1:
            earlier = set(marked[:-1])
            rest = [item for i, item in enumerate(items) if i not in earlier]
            at = rest.index(items[marked[-1]])
            items[:] = rest[:at] + [items[i] for i in marked[:-1]] + rest[at:]
    users: dict[str, set[str]] = {}
    for item in items:
        for key in _image_keys(item):
            users.setdefault(key, set()).add(item.nodeid)
    config.stash[_IMAGE_USERS] = users


def _image_keys(item: pytest.Item) -> set[str]:
    return {str(k) for mark in item.iter_markers("image") for k in mark.args}


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    users = item.config.stash.get(_IMAGE_USERS, {})
    for key in _image_keys(item):
        waiting = users.get(key)
        if waiting is None:
            continue
        waiting.discard(item.nodeid)
        if not waiting:
            del users[key]
            if str(ROOT / "tests" / "smoke") not in sys.path:
                sys.path.insert(0, str(ROOT / "tests" / "smoke"))
            from smoke_helpers import release_image

            done = release_image(key)
            reporter = item.config.pluginmanager.get_plugin("terminalreporter")
            capture = item.config.pluginmanager.get_plugin("capturemanager")
            if done and reporter is not None and capture is not None:
                # Teardown runs with output captured: the line reaches the log only with capture suspended.
                with capture.global_and_fixture_disabled():
                    reporter.write_line(f"[forge tests] {done}")
