"""CycloneDX SBOMs: the document from an inventory text, and from real images in the engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from builders.bootstrap import ensure_base
from builders.container import Engine, RunSpec
from builders.project import Project
from builders.repro.sbom import Bom, build_sbom, write_sbom

INVENTORY = "\n".join(
    [
        "FORGE-DEB\tbash\t5.2.15-2+b7\tamd64\tbash\t5.2.15-2\tii ",
        "FORGE-DEB\tbsdutils\t1:2.38.1-5+deb12u3\tamd64\tutil-linux\t2.38.1-5+deb12u3\tii ",
        "FORGE-DEB\told-removed\t1.0\tamd64\t\t\trc ",
        "FORGE-OS\tID=debian",
        'FORGE-OS\tVERSION_ID="12"',
        'FORGE-OS\tPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"',
        "FORGE-PY\t"
        + json.dumps(
            {
                "executable": "/opt/venv/bin/python3",
                "version": "3.11.2",
                "dists": [
                    {
                        "name": "PyYAML",
                        "version": "6.0.2",
                        "license_expression": None,
                        "license": "MIT",
                        "classifiers": [],
                        "location": "/opt/venv/lib/python3.11/site-packages",
                        "installer": "pip",
                    },
                    {
                        "name": "aiohttp",
                        "version": "3.14.5",
                        "license_expression": "Apache-2.0 AND MIT",
                        "license": None,
                        "classifiers": [],
                        "location": "/opt/venv/lib/python3.11/site-packages",
                        "installer": "pip",
                    },
                ],
            }
        ),
    ]
)


def _validate(text: str) -> None:
    validation = pytest.importorskip("cyclonedx.validation.json", reason="cyclonedx-python-lib[json-validation]")
    schema = pytest.importorskip("cyclonedx.schema")
    error = validation.JsonStrictValidator(schema.SchemaVersion.V1_5).validate_str(text)
    assert error is None, str(error)


def _document(**changes: Any) -> Bom:
    args: dict[str, Any] = {
        "image_id": "sha256:" + "ab" * 32,
        "image_name": "forge/debian-12-router",
        "labels": {"dev.forge.recipe": "router"},
        "output": INVENTORY,
        "source_date_epoch": 1735689600,
        "distro": "debian-12",
        "target": "router",
    }
    args.update(changes)
    return build_sbom(**args)


def test_document_lists_installed_os_and_python_packages_with_purls() -> None:
    doc = _document()
    refs = [c["bom-ref"] for c in doc["components"]]
    assert refs == [
        "os:debian-12",
        "pkg:deb/debian/bash@5.2.15-2%2Bb7?arch=amd64&distro=debian-12",
        "pkg:deb/debian/bsdutils@1%3A2.38.1-5%2Bdeb12u3?arch=amd64&distro=debian-12",
        "pkg:pypi/aiohttp@3.14.5",
        "pkg:pypi/pyyaml@6.0.2",
    ]  # the package left with config files only (rc) is not installed
    assert doc["specVersion"] == "1.5" and doc["metadata"]["timestamp"] == "2025-01-01T00:00:00Z"
    _validate(json.dumps(doc))


def test_document_is_deterministic_and_its_serial_follows_the_image() -> None:
    assert _document() == _document()
    assert _document()["serialNumber"] != _document(image_id="sha256:" + "cd" * 32)["serialNumber"]


@pytest.mark.engine
def test_sbom_of_the_debian_base_counts_what_dpkg_counts(project: Project, engine: Engine, tmp_path: Path) -> None:
    distro = project.distro("debian-12")
    image = ensure_base(distro, engine).ref
    result = write_sbom(engine, image, tmp_path, distro="debian-12", target="base", source_date_epoch=1735689600)
    rc, out = engine.run_once(
        RunSpec(image=image, command=["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package}\n"]), timeout=60
    )
    assert rc == 0
    installed = {line.split()[1] for line in out.splitlines() if line.startswith("ii")}
    doc = json.loads(result.path.read_text())
    names = {c["name"] for c in doc["components"] if c["type"] == "library"}
    assert names == installed and result.os_packages == len(installed) and result.package_manager == "dpkg"
    assert doc["metadata"]["component"]["version"] == engine.image_info(image).id
    _validate(result.path.read_text())
    again = write_sbom(
        engine, image, tmp_path / "again", distro="debian-12", target="base", source_date_epoch=1735689600
    )
    assert again.sha256 == result.sha256
