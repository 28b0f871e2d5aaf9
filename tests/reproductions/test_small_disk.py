"""Too small a rootfs for the engine's layers: preflight blocks it, a forced build hits ENOSPC, diagnosis says so."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from builders.bootstrap import ensure_base
from builders.build import BuildOptions, build
from builders.config.models import Distro
from builders.container import Engine
from builders.errors import BuildFailed
from builders.preflight import run_preflight
from builders.project import Project
from builders.sources import fetch_wheelhouse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "smoke"))
from smoke_helpers import carry_image

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _copy_base(distro: Distro, source: Engine, target: Engine) -> None:
    """The base the main engine has (bootstrapping it there if missing), loaded into the small one: the bootstrap
    path has its own test (test_engine_build.py), and a second mmdebstrap here cost CI a minute for the same tree."""
    ensure_base(distro, source)
    carry_image(source, target, distro.base.local_tag, distro.base.local_tag)


def test_small_engine_root_is_blocked_then_fails_with_enospc(
    project: Project, engine: Engine, small_engine: Engine, tmp_path: Path
) -> None:
    """`engine` comes first: it connects to the main dockerd before small_engine points DOCKER_HOST elsewhere."""
    distro, recipe = project.distro("debian-12"), project.recipe_for("cpu-wheel")
    assert engine.root_dir != small_engine.root_dir, "both fixtures answer from the same engine"
    wheelhouse = fetch_wheelhouse(recipe, distro, project.root)
    _copy_base(distro, engine, small_engine)

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
