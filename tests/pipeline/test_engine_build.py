"""Engine-backed: bases from Debian's archive, a small real image build, and nothing left after a failure."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from builders.bootstrap import bootstrap, ensure_base
from builders.build import BuildOptions, build
from builders.container import Engine, RunSpec
from builders.errors import BaseUnavailable, BuildFailed
from builders.project import Project
from builders.report import BuildReport

pytestmark = pytest.mark.engine


def _forge_containers(engine: Engine) -> list[str]:
    return engine.containers_with_label("forge.owner")


def test_bootstrap_debian_12_from_the_archive(project: Project, engine: Engine) -> None:
    distro = project.distro("debian-12")
    result = bootstrap(distro, engine)
    assert result.how == "bootstrapped" and result.rootfs_sha256
    rc, out = engine.run_once(RunSpec(image=distro.base.local_tag, command=["cat", "/etc/debian_version"]), timeout=60)
    assert rc == 0 and out.strip().startswith("12.")
    # A second ensure finds the local base without touching the network.
    assert ensure_base(distro, engine).how == "local"


def test_unreachable_base_stops_at_once_naming_the_ways_out(project: Project, engine: Engine) -> None:
    distro = project.distro("fedora-44")
    if engine.image_exists(distro.base.local_tag):
        pytest.skip("a Fedora base is loaded here: nothing unreachable to report")
    with pytest.raises(BaseUnavailable) as err:
        ensure_base(distro, engine)
    text = err.value.render()
    assert "registry.fedoraproject.org" in text
    assert "forge bootstrap fedora-44" in text and distro.base.local_tag in text


def test_router_image_builds_tests_and_tags(project: Project, engine: Engine, tmp_path: Path) -> None:
    tag = "forge/test-router:engine-test"
    engine.untag(tag)
    report = build(
        project,
        project.distro("debian-12"),
        project.recipe_for("router"),
        BuildOptions(max_jobs=1, tag=tag, reports_dir=tmp_path, skip_preflight=True),
        lambda _l: None,
    )
    try:
        assert report.result == "succeeded"
        assert report.builder is not None and report.builder.name in {"buildkit", "legacy"}
        assert all(t.ok for t in report.tests) and report.tests
        info = engine.image_info(tag)
        assert info.labels["dev.forge.recipe"] == "router"
        assert info.labels["dev.forge.distro"] == "debian-12"
        assert set(report.phases) >= {"engine", "base", "context", "build", "test", "tag"}
        assert (tmp_path / "report.json").exists() and (tmp_path / "summary.txt").exists()
        # A real build's report, every section filled, reads back through its model unchanged.
        written = json.loads((tmp_path / "report.json").read_text())
        assert BuildReport.read(tmp_path / "report.json").as_json() == written
        # The CA bundle was a build secret: it is nowhere in the final image.
        rc, out = engine.run_once(
            RunSpec(
                image=tag,
                command=[
                    "-c",
                    "import pathlib; print([str(p) for p in pathlib.Path('/').rglob("
                    "'ca_bundle*') if '/proc' not in str(p)])",
                ],
                entrypoint=["python3"],
            ),
            timeout=120,
        )
        assert rc == 0 and out.strip().endswith("[]"), out
    finally:
        engine.untag(tag)
        engine.untag(tag.rsplit(":", 1)[0] + ":latest")


def test_failed_build_leaves_no_container_and_no_tag(project_copy: Path, engine: Engine, tmp_path: Path) -> None:
    recipe = project_copy / "recipes" / "router.yaml"
    text = recipe.read_text()
    failing = re.sub(r"(?m)^app_requirements: \[.*\]$", "app_requirements: [forge-no-such-package-xyz==0.0.0]", text)
    assert failing != text, "recipes/router.yaml has no one-line app_requirements to replace"
    recipe.write_text(failing)
    shutil.copytree(Path(__file__).resolve().parents[2] / "builders", project_copy / "builders")
    project = Project.load(project_copy)
    tag = "forge/test-router:must-not-exist"
    if engine.image_exists(tag):  # left by an earlier run whose build did not fail: this run must not inherit it
        engine.remove_image(tag)
    before = set(_forge_containers(engine))
    every_before = set(engine.all_containers())
    with pytest.raises(BuildFailed):
        build(
            project,
            project.distro("debian-12"),
            project.recipe_for("router"),
            BuildOptions(max_jobs=1, tag=tag, reports_dir=tmp_path, skip_preflight=True),
            lambda _l: None,
        )
    assert not engine.image_exists(tag)
    assert set(_forge_containers(engine)) == before
    assert not [
        cid
        for cid, status in engine.all_containers().items()
        if status in {"created", "exited"} and cid not in every_before
    ]
    report = (tmp_path / "report.json").read_text()
    assert '"result": "failed"' in report
    assert "forge-no-such-package-xyz" in (tmp_path / "build.log").read_text()
