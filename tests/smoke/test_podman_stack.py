"""Engine-backed, on Podman as .ci/engines sets it up: the engine check, the router and cpu-wheel images built
with `--engine podman` (each once per session, smoke_helpers.podman_image) through their test stages, the CA
bundle in no layer, `forge smoke --engine podman`, the router built rootless, and no container left after."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import certifi
import pytest
from smoke_helpers import ROOT, free_base_port, marked_ca_bundle, podman_base, podman_image

from builders.cli import main
from builders.container import Engine, RunSpec, connect
from builders.errors import EngineError
from builders.preflight import run_preflight
from builders.project import Project
from builders.repro.image_export import export_image
from builders.smoke.plan import RUN_LABEL
from builders.smoke.profile import load_profile
from builders.trust import find_ca_bundle

pytestmark = pytest.mark.engine

ROOTLESS_USER = "forge-rootless"  # made by .ci/engines, with its subuid/subgid ranges
CAP_SYS_RESOURCE = 24


@pytest.fixture(scope="module")
def podman() -> Iterator[Engine]:
    try:
        engine = connect("podman")
    except EngineError as exc:
        pytest.fail(f"Podman tests, but {exc.message} (`nox -s engines` sets Podman up)")
    before = set(engine.containers_with_label("forge.throwaway"))
    yield engine
    # Every throwaway container these tests' builds and checks ran is gone (the suite's own end checks that
    # `podman ps -a` is empty: noxfile.py's tests session).
    assert set(engine.containers_with_label("forge.throwaway")) - before == set()


def _report(target: str) -> dict[str, object]:
    report: dict[str, object] = json.loads(
        (ROOT / "reports" / f"podman-debian-12-{target}" / "report.json").read_text()
    )
    return report


def test_an_imported_rootfs_is_found_by_its_short_name(podman: Engine, tmp_path: Path) -> None:
    # What `forge bootstrap --engine podman` does with mmdebstrap's tarball, on a one-file rootfs.
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        tar.add("/sbin/ldconfig", arcname="probe")
    ref = "forge/podman-import-test:1"
    try:
        podman.import_rootfs(str(rootfs), ref, changes=['CMD ["/probe", "--version"]'])
        assert podman.image_exists(ref) and "localhost/" + ref in podman.image_info(ref).tags
        rc, out = podman.run_once(RunSpec(image=ref, command=[]), timeout=60)
        assert rc == 0 and "ldconfig" in out
    finally:
        podman.remove_image(ref)
    assert not podman.image_exists(ref)


def test_the_engine_check_names_rlimits_above_the_hard_limit(
    podman: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    podman.check()  # as .ci/engines set it up: a container starts
    # Root with CAP_SYS_RESOURCE (every ordinary root CI VM) may raise rlimits past the hard limit: the runtime's
    # setrlimit would succeed and leave nothing to refuse. So the Podman this check starts runs without the
    # capability, as root does on a host that withholds it (a container, a hardened VM), wherever this runs.
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to start Podman without CAP_SYS_RESOURCE"
    drop = [setpriv, "--inh-caps=-sys_resource", "--bounding-set=-sys_resource"]
    status = subprocess.run([*drop, "cat", "/proc/self/status"], capture_output=True, text=True, check=True).stdout
    caps = {line.split(":")[0]: int(line.split()[1], 16) for line in status.splitlines() if line.startswith("Cap")}
    assert not any(caps[kind] & (1 << CAP_SYS_RESOURCE) for kind in ("CapEff", "CapPrm", "CapBnd")), caps
    real = shutil.which("podman")
    assert real, "podman is on PATH (the fixture connected to it)"
    wrapper = tmp_path / "bin" / "podman"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {" ".join(drop)} {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("podman") == str(wrapper)
    # Podman's own default, nproc above what Podman caps itself to (pid_max), in an otherwise working config.
    nproc = 2 * int(Path("/proc/sys/kernel/pid_max").read_text())
    assert podman.facts.cgroups is not None
    conf = tmp_path / "containers.conf"
    conf.write_text(
        f'[containers]\ndefault_ulimits = ["nproc={nproc}:{nproc}"]\n[engine]\nruntime = "{podman.facts.runtime}"\n'
        f'cgroup_manager = "{podman.facts.cgroups.split()[1]}"\nevents_logger = "file"\n'
    )
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))
    with pytest.raises(EngineError) as err:
        connect("podman").check()
    text = err.value.render()
    assert "rlimits above" in text and "default_ulimits" in text and "rlimit type" in text


def test_preflight_checks_buildahs_scratch_dir_where_it_is_a_small_tmpfs(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=False)
    assert mounted.returncode == 0, "mounting a tmpfs needs root, as CI has"
    try:
        monkeypatch.setenv("TMPDIR", str(small))  # where buildah stages layers, as `podman info` reports it
        engine = connect("podman")
        assert engine.facts.scratch_dirs == (str(small),)
        report = run_preflight(
            project,
            project.distro("debian-12"),
            project.recipe_for("cpu"),
            engine=engine,
            source=ROOT / "tests" / "preflight" / "fixtures" / "vllm-0.33.0",
            max_jobs=None,
            scratch_dir=tmp_path / "scratch",
            probe=False,
        )
    finally:
        subprocess.run(["umount", str(small)], check=True)
    found = {f.gate: f for f in (*report.findings, *report.passed)}
    assert found["disk-builder-scratch"].blocking and str(small) in found["disk-builder-scratch"].found
    assert "tmpfs" in found["builder-scratch-tmpfs"].found and "TMPDIR" in found["builder-scratch-tmpfs"].remedy
    assert found["disk-layers"].found.endswith("/var/lib/containers/storage")


@pytest.mark.timeout(1200)
@pytest.mark.image("podman:router")
def test_router_built_on_podman_passes_its_tests_and_no_layer_holds_the_ca_bundle(podman: Engine) -> None:
    tag = podman_image("router")
    report = _report("router")
    engine, builder = report["engine"], report["builder"]
    assert isinstance(engine, dict) and isinstance(builder, dict)
    assert (engine["kind"], engine["rootless"]) == ("podman", False)
    assert builder["name"] == "buildah" and builder["version"] and builder["secrets"] is True
    tests = report["tests"]
    assert isinstance(tests, list) and tests and all(t["ok"] for t in tests)
    # One name for every command: the short tag finds what the build stored as localhost/forge/....
    info = podman.image_info(tag)
    assert f"localhost/{tag}" in info.tags and podman.image_exists(tag.rsplit(":", 1)[0] + ":latest")
    assert info.labels["dev.forge.recipe"] == "router"
    # SOURCE_DATE_EPOCH is the image's creation time (buildah --timestamp), as verify-repro needs.
    build_args = report["build_args"]
    assert isinstance(build_args, dict) and build_args["SOURCE_DATE_EPOCH"]
    created = datetime.fromisoformat(info.created.replace(" UTC", "").replace("Z", "+00:00"))
    assert created.timestamp() == int(build_args["SOURCE_DATE_EPOCH"])
    # The CA bundle was a build secret: its bytes are in no layer, under any name.
    bundle = hashlib.sha256(marked_ca_bundle().read_bytes()).hexdigest()
    image = export_image(podman, tag)
    assert image.layers
    found = [
        (layer.created_by[:60], path)
        for layer in image.layers
        for path, entry in layer.entries.items()
        if entry.digest == bundle or "ca_bundle" in path
    ]
    assert found == []


# The cpu-wheel image is Docker's test-staged build loaded into Podman, shared with the kube-play test
# (smoke_helpers.podman_image); the router is Podman's own build.
@pytest.mark.timeout(1800)
@pytest.mark.image("podman:cpu-wheel", "docker:cpu-wheel", "podman:router")
def test_smoke_on_podman_passes_the_ci_profile_and_leaves_nothing(
    podman: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI once found two smoke-labelled containers after a clean run: whether an earlier test left them is told
    # apart from this run leaving them by looking first, and either way the message names them.
    assert podman.containers_with_label(RUN_LABEL) == [], "before this run: " + _smoke_containers()
    image, router = podman_image("cpu-wheel"), podman_image("router")
    staged = json.loads((ROOT / "reports" / "smoke-debian-12-cpu-wheel" / "report.json").read_text())
    assert staged["tests"] and all(t["ok"] for t in staged["tests"])
    profile, _ = load_profile("ci", root=ROOT)
    monkeypatch.setenv("FORGE_ENGINE", "podman")  # what --engine sets, given back after the test
    base = free_base_port(profile.replica_count)
    args = ["--engine", "podman", "--profile", "ci", "--router-image", router, "--base-port", str(base)]
    code = main(["smoke", image, *args, "--report", str(tmp_path)])
    reports = sorted(tmp_path.glob("smoke-ci-*.json"))
    assert code == 0 and reports, f"forge smoke exited {code}"
    report = json.loads(reports[-1].read_text())
    assert report["gates"]["passed"] is True
    assert report["teardown"]["clean"] is True and report["teardown"]["leftovers"] == []
    assert report["replicas_from"].startswith(f"image {image}")
    assert podman.containers_with_label(RUN_LABEL) == [], f"after run {report['run_id']}: " + _smoke_containers()


def _smoke_containers() -> str:
    """Every smoke-labelled container with its name (which carries its run id), labels and state."""
    fmt = "{{.Names}} {{.State}} {{.Labels}}"
    argv = ["podman", "ps", "--all", "--filter", f"label={RUN_LABEL}", "--format", fmt]
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def _rootless_python() -> Path:
    """A Python the rootless user may run, with Forge's dependencies (Forge itself comes from PYTHONPATH): the
    interpreter running the tests may live where that user cannot read (/root/.pyenv)."""
    venv = Path("/opt/forge-rootless-venv")
    python = venv / "bin" / "python"
    if not python.exists():
        base = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        # `forge build` imports neither the sweep's plotting (matplotlib, with numpy: most of the download) nor nox.
        deps = [d for d in deps if not d.startswith(("matplotlib", "nox"))]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *deps], check=True)
    return python


def _as_user(user: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *argv], text=True, capture_output=True, cwd=cwd, check=False)


@pytest.mark.timeout(1800)
def test_router_builds_rootless_as_a_user_with_subuids(podman: Engine) -> None:
    try:
        account = pwd.getpwnam(ROOTLESS_USER)
    except KeyError:
        pytest.fail(f"no user {ROOTLESS_USER}: `nox -s engines` makes it, with its subuid/subgid ranges")
    python = _rootless_python()
    work = Path(tempfile.mkdtemp(prefix="forge-rootless-"))
    # The user gets a copy of the project: the checkout itself may be out of its reach (a CI clone under a
    # 0700 folder failed here with "No module named 'builders'").
    checkout = work / "checkout"
    for sub in ("builders", "containers", "distros", "recipes", "profiles"):
        shutil.copytree(ROOT / sub, checkout / sub, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("pyproject.toml", "forge.lock"):
        shutil.copy2(ROOT / name, checkout / name)
    for path in (work, *work.rglob("*")):
        os.chown(path, account.pw_uid, account.pw_gid)
    env = ["env", f"HOME={account.pw_dir}", f"PYTHONPATH={checkout}", f"TMPDIR={work}", f"FORGE_CACHE={work / 'cache'}"]
    tag = "forge/debian-12-router:rootless-test"
    try:
        # The base, from root's Podman into the user's own storage (~/.local/share/containers).
        archive = work / "base.tar"
        subprocess.run(["podman", "save", "--output", str(archive), podman_base()], check=True, capture_output=True)
        archive.chmod(0o644)
        loaded = _as_user(ROOTLESS_USER, ["podman", "load", "--input", str(archive)], cwd=work)
        assert loaded.returncode == 0, loaded.stderr
        archive.unlink()
        argv = [str(python), "-m", "builders.cli", "--root", str(checkout), "build", "debian-12", "router"]
        argv += ["--engine", "podman"]
        # The host's trust, where the user can read it: builds here reach PyPI through an intercepting proxy.
        bundle = work / "ca_bundle.pem"
        shutil.copyfile(find_ca_bundle()[0] or certifi.where(), bundle)
        bundle.chmod(0o644)
        argv += ["--skip-preflight", "--tag", tag, "--report-dir", str(work / "report"), "--ca-bundle", str(bundle)]
        built = _as_user(ROOTLESS_USER, env + argv, cwd=work)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        report = json.loads((work / "report" / "report.json").read_text())
        assert report["engine"]["kind"] == "podman" and report["engine"]["rootless"] is True
        assert report["engine"]["root_dir"].startswith(account.pw_dir)
        assert report["tests"] and all(t["ok"] for t in report["tests"])
    finally:
        refs = [f"localhost/{tag}", f"localhost/{tag.rsplit(':', 1)[0]}:latest"]
        _as_user(ROOTLESS_USER, ["podman", "rmi", "--force", *refs], cwd=work)
        left = _as_user(ROOTLESS_USER, ["podman", "ps", "--all", "--quiet"], cwd=work)
        shutil.rmtree(work, ignore_errors=True)
    assert left.stdout.strip() == ""
