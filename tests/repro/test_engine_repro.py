"""Engine-backed: forge lock on real inputs, --locked refusing drift, the build's SBOM, verify-repro on the router."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.bootstrap import ensure_base
from builders.build import BuildOptions, build
from builders.cli import main
from builders.container import Engine, RunSpec
from builders.project import Project
from builders.repro.errors import LockDrift
from builders.repro.lockfile import LockFile, LockRecord, merge, read_lock, write_lock
from builders.repro.resolve import resolve_pair
from builders.repro.sbom import SBOM_LABEL, SbomRecord
from builders.verify.report import ReproVerdict, read_repro
from builders.verify.repro import VerifyOptions, verify_repro

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def frozen_project(tmp_path: Path) -> Path:
    """A copy of the data and of builders/: the router image carries builders/, which others may be editing."""
    root = tmp_path / "project"
    for sub in ("distros", "recipes", "containers", "builders"):
        shutil.copytree(ROOT / sub, root / sub, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


@pytest.fixture
def debian_12_base(project: Project, engine: Engine) -> str:
    return ensure_base(project.distro("debian-12"), engine).ref


@pytest.fixture
def untag(engine: Engine) -> Iterator[list[str]]:
    refs: list[str] = []
    yield refs
    for ref in refs:
        engine.untag(ref)


def test_forge_lock_writes_the_same_bytes_twice_and_check_finds_drift(
    frozen_project: Path, debian_12_base: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = frozen_project / "forge.lock"
    assert main(["--root", str(frozen_project), "lock", "debian-12", "router"]) == 0
    first = lock.read_text()
    assert main(["--root", str(frozen_project), "lock", "debian-12", "router"]) == 0
    assert lock.read_text() == first
    entry = read_lock(lock).pairs["debian-12/router"]
    assert entry.base.ref == debian_12_base and entry.base.rootfs
    assert main(["--root", str(frozen_project), "lock", "--check", "debian-12", "router"]) == 0
    recipe = frozen_project / "recipes" / "router.yaml"
    text = recipe.read_text()
    drifted = re.sub(r"(?m)^(app_requirements: \[.*)\]$", r"\1, rich]", text)
    assert drifted != text, "recipes/router.yaml has no one-line app_requirements to extend"
    recipe.write_text(drifted)
    capsys.readouterr()
    assert main(["--root", str(frozen_project), "lock", "--check", "debian-12", "router"]) == LockDrift.exit_code
    assert "requirements.app[rich]: locked (absent), now rich" in capsys.readouterr().err


def test_locked_build_refuses_a_moved_base_before_building(
    project: Project, engine: Engine, debian_12_base: str, tmp_path: Path, untag: list[str]
) -> None:
    distro, recipe = project.distro("debian-12"), project.recipe_for("router")
    current = resolve_pair(project, distro, recipe, engine)
    moved = current.model_copy(update={"base": current.base.model_copy(update={"rootfs": ("sha256:" + "0" * 64,)})})
    lock = tmp_path / "forge.lock"
    write_lock(lock, merge(LockFile(), [moved]))
    tag = "forge/test-repro-router:locked"
    untag += [tag, tag.rsplit(":", 1)[0] + ":latest"]
    with pytest.raises(LockDrift) as err:
        build(
            project,
            distro,
            recipe,
            BuildOptions(
                max_jobs=1, tag=tag, reports_dir=tmp_path / "r", skip_preflight=True, locked=True, lock_file=lock
            ),
            lambda _l: None,
        )
    text = err.value.render()
    assert f"base.rootfs: locked sha256:{'0' * 64}, now {' '.join(current.base.rootfs)}" in text
    assert not engine.image_exists(tag)
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["result"] == "failed" and "build" not in report["phases"]


def test_build_writes_an_sbom_of_the_image_and_records_the_lock(
    frozen_project: Path, engine: Engine, debian_12_base: str, tmp_path: Path, untag: list[str]
) -> None:
    project = Project.load(frozen_project)
    distro, recipe = project.distro("debian-12"), project.recipe_for("router")
    assert main(["--root", str(frozen_project), "lock", "debian-12", "router"]) == 0
    tag = "forge/test-repro-router:sbom"
    untag += [tag, tag.rsplit(":", 1)[0] + ":latest"]
    report = build(
        project,
        distro,
        recipe,
        BuildOptions(max_jobs=1, tag=tag, reports_dir=tmp_path, skip_preflight=True, locked=True),
        lambda _l: None,
    )
    assert report.result == "succeeded"
    assert isinstance(report.lock, LockRecord) and report.lock.matches
    assert report.lock.entries.base.ref == debian_12_base
    assert report.build_args["SOURCE_DATE_EPOCH"] == str(
        read_lock(frozen_project / "forge.lock").pairs["debian-12/router"].source_date_epoch
    )
    assert isinstance(report.sbom, SbomRecord) and Path(report.sbom.path) == tmp_path / "sbom.cdx.json"
    doc = json.loads((tmp_path / "sbom.cdx.json").read_text())
    assert doc["metadata"]["component"]["version"] == engine.image_info(tag).id == report.sbom.image_id
    python = {
        c["name"].lower(): c["version"]
        for c in doc["components"]
        if any(p["value"] == "python" for p in c.get("properties", []))
    }
    rc, out = engine.run_once(
        RunSpec(
            image=tag,
            command=[
                "-c",
                "import aiohttp, pydantic, yaml; print(aiohttp.__version__, pydantic.VERSION, yaml.__version__)",
            ],
            entrypoint=["python3"],
        ),
        timeout=120,
    )
    assert rc == 0
    assert [python["aiohttp"], python["pydantic"], python["pyyaml"]] == out.split()[-3:]
    os_names = {c["name"] for c in doc["components"] if c["type"] == "library"} - set(python)
    assert "python3" in os_names
    assert engine.image_info(tag).labels[SBOM_LABEL] == "reports/debian-12-router/sbom.cdx.json"


@pytest.mark.slow
def test_verify_repro_router_debian_12(
    frozen_project: Path, debian_12_base: str, tmp_path: Path, engine: Engine
) -> None:
    project = Project.load(frozen_project)
    result = verify_repro(
        project,
        project.distro("debian-12"),
        project.recipe_for("router"),
        VerifyOptions(build=BuildOptions(max_jobs=1, reports_dir=tmp_path)),
        lambda _l: None,
    )
    data = json.loads(result.report.read_text())
    assert data["source_date_epoch"] is not None
    # The verdict file reads back through its model.
    verdict = read_repro(result.report)
    assert isinstance(verdict, ReproVerdict) and verdict.reproducible == result.comparison.reproducible
    assert not engine.image_exists("forge/repro-debian-12-router:first")
    assert result.comparison.layers, "no layer above the base was compared"
    assert result.comparison.reproducible, result.comparison.summary()
