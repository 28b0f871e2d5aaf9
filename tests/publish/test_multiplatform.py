"""amd64 and arm64 router images under one name in a real registry, and pulled back by digest.

The arm64 image is built here under qemu-user-static (its base bootstrapped with mmdebstrap --arch=arm64 when
the engine has none): the CI's one arm64 build, kept to the router, the smallest image.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from builders.build import BuildOptions, build
from builders.container import Engine
from builders.emulation import describe as describe_stand_in
from builders.log import Log
from builders.platforms import PLATFORMS, for_platform
from builders.project import Project
from builders.publish import proven, publish
from builders.registry import RegistryClient, parse_reference
from builders.registry.client import DOCKER_LIST
from builders.smoke.runtimes import Runtimes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "smoke"))
from smoke_helpers import ROOT, router_image

pytestmark = [pytest.mark.engine, pytest.mark.emulation]
AMD64, ARM64 = PLATFORMS["linux/amd64"], PLATFORMS["linux/arm64"]


@functools.cache
def arm64_router() -> Path:
    """The arm64 router image, built and test-staged once per session; returns its report folder."""
    project = Project.load(ROOT)
    folder = ROOT / "reports" / "publish-debian-12-router-arm64"
    report = build(
        project,
        for_platform(project.distro("debian-12"), ARM64),
        project.recipe_for("router"),
        BuildOptions(max_jobs=1, tag="forge/debian-12-router-arm64:publish-test", reports_dir=folder),
        lambda _line: None,
    )
    assert report.result == "succeeded", report.summary()
    return folder


# The one arm64 build: a long proof, run by `nox -s publish-multiplatform` and recorded in the docs, not by the
# suite (marker `emulation`). On an idle 2-core host the arm64 base bootstraps in about 2 min and the router builds
# and test-stages in about 2 min more (apt and pip under qemu); on a busy EPYC the whole test took 467 s of a CI
# run that has to stay under 45 minutes. The same took 14 and 52 min on a host at load 9-23.
def test_both_platforms_are_pushed_under_one_index_and_pulled_back_by_digest(
    tmp_path: Path, registry: str, engine: Engine
) -> None:
    router_image()
    folders = {}
    for plat, source in ((AMD64, ROOT / "reports" / "smoke-debian-12-router"), (ARM64, arm64_router())):
        folders[plat.name] = tmp_path / plat.oci_arch
        shutil.copytree(source, folders[plat.name])
    arm64_report = json.loads((folders[ARM64.name] / "report.json").read_text())
    # Under emulation the test stage still ran its checks in arm64 processes; each says what it found.
    assert arm64_report["platform"] == {
        "name": "linux/arm64",
        "host": "x86_64",
        "emulated": True,
        "stand_in": describe_stand_in("aarch64", "x86_64"),
    }
    assert {t["name"]: t["status"] for t in arm64_report["tests"]} == {
        "entrypoint-help": "passed",
        "router-relay": "passed",
    }
    ref = parse_reference(f"{registry}/forge/test-router-multi:{uuid.uuid4().hex[:8]}")
    images = [proven(engine, folders[p.name], p) for p in (AMD64, ARM64)]
    reports = publish(engine, images, ref, Log(lambda _line: None))

    client = RegistryClient(ref)
    index, media_type, digest = client.get_manifest(ref.name, ref.tag or "latest")
    assert media_type == DOCKER_LIST
    by_arch = {m["platform"]["architecture"]: m["digest"] for m in index["manifests"]}
    assert reports[0].push is not None and reports[1].push is not None
    assert by_arch == {"amd64": reports[0].push.digest, "arm64": reports[1].push.digest}
    for report in reports:
        assert report.push is not None and report.push.index is not None and report.push.index.digest == digest
        served = client.head_manifest(ref.name, report.push.digest)
        assert served is not None and served[0] == report.push.digest
    # The arm64 child really is arm64: its config says so.
    child, _, _ = client.get_manifest(ref.name, by_arch["arm64"])
    assert reports[1].image is not None and child["config"]["digest"] == reports[1].image.id

    # Pulled by the index digest, the engine gets exactly the image the amd64 report proved.
    pinned = f"{ref.repository}@{digest}"
    runtimes = Runtimes.choose(images={"vllm": pinned}, local={}, router_image=None)
    try:
        lines = runtimes.pull_pinned()
        assert lines and reports[0].image is not None and engine.image_info(pinned).id == reports[0].image.id
    finally:
        engine.untag(pinned)
