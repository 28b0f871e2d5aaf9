"""`forge push` against a real registry (Debian's docker-registry) and the real engine.

The image is the router's, built once per session by the shared helper; each test pushes from a copy of its
report folder, so the helper's own report is never rewritten.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from builders.cli import main
from builders.container import Engine
from builders.publish import sbom_tag
from builders.registry import RegistryClient, parse_reference
from builders.registry.local import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "smoke"))
from smoke_helpers import ROOT, router_image

pytestmark = pytest.mark.engine


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def forge(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """The CLI in this process (its exit code and output), as a user's shell would see them."""

    def run(*args: str) -> Ran:
        code = main(["--root", str(ROOT), *args])
        out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    return run


@pytest.fixture
def router_report(tmp_path: Path) -> Path:
    router_image()
    folder = tmp_path / "report"
    shutil.copytree(ROOT / "reports" / "smoke-debian-12-router", folder)
    return folder


def test_a_push_records_the_digest_the_registry_serves_and_the_sbom_beside_it(
    router_report: Path, registry: str, engine: Engine, forge: Callable[..., Ran]
) -> None:
    ref = f"{registry}/forge/test-router:{uuid.uuid4().hex[:8]}"
    done = forge("push", "debian-12", "router", ref, "--report-dir", str(router_report))
    assert done.returncode == 0, done.stderr
    report = json.loads((router_report / "report.json").read_text())
    push = report["push"]
    client = RegistryClient(parse_reference(ref))
    name, tag = ref.split("/", 1)[1].rsplit(":", 1)
    served = client.head_manifest(name, tag)
    assert served is not None and served[0] == push["digest"]
    assert push["pull"] == f"{registry}/forge/test-router@{served[0]}"
    assert report["lock"]["pushed"]["digest"] == served[0]
    assert f"pushed: {push['pull']}" in (router_report / "summary.txt").read_text()
    # The SBOM is found from the image digest alone, and names the image as its subject.
    artifact, media_type, _ = client.get_manifest(name, sbom_tag(served[0]))
    assert artifact["subject"]["digest"] == served[0]
    assert artifact["artifactType"] == "application/vnd.cyclonedx+json"
    assert media_type.startswith("application/vnd.oci.image.manifest.v1+json")
    sbom = (ROOT / "reports" / "smoke-debian-12-router" / "sbom.cdx.json").read_bytes()
    assert artifact["layers"][0]["size"] == len(sbom)
    assert not engine.image_exists(ref), "the registry tag is not left in the engine"


def test_an_image_whose_test_stage_failed_is_refused_and_its_report_kept(
    router_report: Path, registry: str, forge: Callable[..., Ran]
) -> None:
    path = router_report / "report.json"
    report = json.loads(path.read_text())
    report["result"], report["tests"][0]["status"], report["tests"][0]["ok"] = "failed", "failed", False
    path.write_text(json.dumps(report))
    before = path.read_bytes()
    done = forge(
        "push", "debian-12", "router", f"{registry}/forge/test-router:refused", "--report-dir", str(router_report)
    )
    assert done.returncode == 17, done.stderr
    assert "push refused" in done.stderr and "the build failed" in done.stderr
    assert path.read_bytes() == before
    # A build that skipped its test stage proved nothing either.
    report.update(result="succeeded", tests=[])
    report["phases"].pop("test", None)
    path.write_text(json.dumps(report))
    done = forge(
        "push", "debian-12", "router", f"{registry}/forge/test-router:refused", "--report-dir", str(router_report)
    )
    assert done.returncode == 17 and "test stage did not run" in done.stderr


def test_a_failed_push_says_why_and_leaves_the_report_as_it_was(
    router_report: Path, engine: Engine, forge: Callable[..., Ran]
) -> None:
    before = (router_report / "report.json").read_bytes()
    summary = (router_report / "summary.txt").read_bytes()
    ref = f"127.0.0.1:{free_port()}/forge/test-router:nobody-listens"
    done = forge("push", "debian-12", "router", ref, "--report-dir", str(router_report))
    assert done.returncode == 18, done.stderr
    assert "push failed" in done.stderr and "connection refused" in done.stderr.lower()
    assert (router_report / "report.json").read_bytes() == before
    assert (router_report / "summary.txt").read_bytes() == summary
    assert sorted(p.name for p in router_report.glob(".*")) == []
    assert not engine.image_exists(ref)
