"""Too small a rootfs for the engine's layers: preflight blocks it, a forced build hits ENOSPC, diagnosis says so."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from builders.bootstrap import bootstrap
from builders.build import BuildOptions, build
from builders.config import Project
from builders.container import Engine
from builders.errors import BuildFailed
from builders.preflight import run_preflight
from builders.sources import fetch_wheelhouse

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_small_engine_root_is_blocked_then_fails_with_enospc(
    project: Project, small_engine: Engine, tmp_path: Path
) -> None:
    distro, recipe = project.distro("debian-12"), project.recipe_for("cpu-wheel")
    wheelhouse = fetch_wheelhouse(recipe, distro, project.root)
    bootstrap(distro, small_engine)

    pre = run_preflight(
        project,
        distro,
        recipe,
        engine=small_engine,
        source=None,
        max_jobs=1,
        scratch_dir=Path(tempfile.gettempdir()),
        wheelhouse=[wheelhouse],
    )
    disk = [f for f in pre.findings if f.gate.startswith("disk") and f.blocking]
    assert pre.blocked and disk, pre.findings
    assert "GiB" in disk[0].found and disk[0].remedy

    tag = "forge/test-small-disk:must-not-exist"
    with pytest.raises(BuildFailed):
        build(
            project,
            distro,
            recipe,
            BuildOptions(
                skip_preflight=True,
                wheelhouse=wheelhouse,
                max_jobs=1,
                tag=tag,
                reports_dir=tmp_path,
            ),
            lambda _line: None,
        )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["diagnosis"]["category"] == "disk-full", report["diagnosis"]
    assert "no space left on device" in report["diagnosis"]["line"].lower()
    assert not small_engine.image_exists(tag)
    assert small_engine.all_containers() == {}
