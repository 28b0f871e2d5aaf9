"""A CycloneDX 1.5 SBOM of a built image, read from the image itself in a throwaway container.

OS packages come from the image's package database (dpkg-query or rpm -qa), Python packages from
importlib.metadata run by the image's own `python3` (the one on its PATH: the venv for Forge's images).
The document is deterministic: its serial number derives from the image id, its timestamp from
SOURCE_DATE_EPOCH, and components are sorted, so one image always gives the same bytes.

Why the image carries only a pointer: a label is part of the image config, which is fixed before the
SBOM can be read from the finished image, and writing the SBOM's digest into the image would change the
image it describes. So the build labels each image with where its SBOM lives by convention
(`dev.forge.sbom` = reports/<distro>-<target>/sbom.cdx.json), and the report records the SBOM's sha256 and
the image id it describes.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import NotRequired, TypedDict
from urllib.parse import quote

from pydantic import Field

from builders.container import Engine, RunSpec
from builders.errors import EngineError
from builders.records import Record

SBOM_NAME = "sbom.cdx.json"
SBOM_LABEL = "dev.forge.sbom"
SPEC_VERSION = "1.5"

_PY_SCRIPT = r"""
import importlib.metadata as md, json, sys
dists = []
for d in md.distributions():
    m = d.metadata
    if not m["Name"]:
        continue
    lic = m["License"] or ""
    dists.append({"name": m["Name"], "version": d.version, "license_expression": m["License-Expression"],
                  "license": lic.strip() if lic.strip() and "\n" not in lic.strip() and len(lic) < 120 else None,
                  "classifiers": sorted(c.split(" :: ")[-1] for c in (m.get_all("Classifier") or [])
                                        if c.startswith("License ::")),
                  "location": str(d.locate_file("")), "installer": (d.read_text("INSTALLER") or "").strip()})
print("FORGE-PY\t" + json.dumps({"executable": sys.executable, "version": sys.version.split()[0], "dists": dists}))
"""

# One shell script for every family: whichever package database the image has answers.
_SCRIPT = (
    "if command -v dpkg-query >/dev/null 2>&1; then "
    "dpkg-query -W -f='FORGE-DEB\\t${Package}\\t${Version}\\t${Architecture}\\t${source:Package}\\t"
    "${source:Version}\\t${db:Status-Abbrev}\\n'; "
    "elif command -v rpm >/dev/null 2>&1; then "
    "rpm -qa --qf 'FORGE-RPM\\t%{NAME}\\t%{EPOCHNUM}\\t%{VERSION}-%{RELEASE}\\t%{ARCH}\\t%{SOURCERPM}\\t%{LICENSE}\\n'; "
    "fi; "
    "[ -r /etc/os-release ] && sed 's/^/FORGE-OS\\t/' /etc/os-release; "
    'for py in python3 python; do if command -v $py >/dev/null 2>&1; then $py -c "$FORGE_PY"; break; fi; done; '
    "true"
)


class SbomFacts(TypedDict):
    """What the report records of an SBOM written (builders/repro/sbom.SbomRecord's first fields)."""

    path: str
    sha256: str
    format: str
    components: int
    os_packages: int
    python_packages: int
    package_manager: str


# CycloneDX 1.5's JSON, as far as Forge writes it (https://cyclonedx.org/docs/1.5/json/): a standard Forge
# follows, not one it owns, so plain typed dicts with the standard's own key names.
class Property(TypedDict):
    name: str
    value: str


class NamedLicense(TypedDict):
    name: str


class License(TypedDict, total=False):
    license: NamedLicense
    expression: str


Component = TypedDict(
    "Component",
    {
        "type": str,
        "bom-ref": str,
        "name": str,
        "version": str,
        "purl": NotRequired[str],
        "description": NotRequired[str],
        "properties": NotRequired[list[Property]],
        "licenses": NotRequired[list[License]],
    },
)


class Tool(TypedDict):
    type: str
    name: str
    version: str


class Tools(TypedDict):
    components: list[Tool]


class Metadata(TypedDict):
    timestamp: str
    tools: Tools
    component: Component


class Dependency(TypedDict):
    ref: str
    dependsOn: list[str]


Bom = TypedDict(
    "Bom",
    {
        "$schema": str,
        "bomFormat": str,
        "specVersion": str,
        "serialNumber": str,
        "version": int,
        "metadata": Metadata,
        "components": list[Component],
        "dependencies": list[Dependency],
    },
)


class PythonDist(TypedDict):
    """One distribution as the image's own Python reports it (_PY_SCRIPT)."""

    name: str
    version: str
    license_expression: str | None
    license: str | None
    classifiers: list[str]
    location: str
    installer: str


class PythonInventory(TypedDict):
    executable: str
    version: str
    dists: list[PythonDist]


@dataclass(frozen=True, kw_only=True)
class SbomResult:
    path: Path
    sha256: str
    components: int
    os_packages: int
    python_packages: int
    package_manager: str

    def to_report(self) -> SbomFacts:
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "format": f"CycloneDX {SPEC_VERSION} JSON",
            "components": self.components,
            "os_packages": self.os_packages,
            "python_packages": self.python_packages,
            "package_manager": self.package_manager,
        }


class SbomRecord(Record):
    path: str = Field(description="the CycloneDX file beside the report")
    sha256: str = Field(description="its hash")
    format: str = Field(description="CycloneDX version and encoding")
    components: int = Field(description="components listed")
    os_packages: int = Field(description="of which OS packages")
    python_packages: int = Field(description="of which Python packages")
    package_manager: str = Field(description="the OS package manager read (dpkg, rpm)")
    image_id: str | None = Field(description="the image it describes")
    label: dict[str, str] = Field(description="the label pointing at it from the image")


class SbomFailed(Record):
    error: str = Field(description="why no SBOM was written (the image stands)")


def sbom_label(distro: str, target: str) -> dict[str, str]:
    """The build-time label pointing at the SBOM by convention (see the module docstring for why not a digest)."""
    return {SBOM_LABEL: f"reports/{distro}-{target}/{SBOM_NAME}"}


def _purl_version(version: str) -> str:
    return quote(version, safe="")


def _forge_version() -> str:
    try:
        return metadata.version("forge-vllm")
    except metadata.PackageNotFoundError:
        return "unknown"


def _normal(name: str) -> str:
    return "".join("-" if c in "_." else c for c in name.lower())


def parse_inventory(output: str) -> tuple[dict[str, str], list[dict[str, str]], PythonInventory | None]:
    """The throwaway container's output → os-release, OS packages, and the Python inventory."""
    os_release: dict[str, str] = {}
    packages: list[dict[str, str]] = []
    python: PythonInventory | None = None
    for line in output.splitlines():
        fields = line.split("\t")
        if fields[0] == "FORGE-OS" and "=" in line:
            key, _, value = fields[1].partition("=")
            os_release[key] = value.strip().strip('"')
        elif fields[0] == "FORGE-DEB" and len(fields) >= 7 and fields[6].startswith("ii"):
            packages.append(
                {
                    "manager": "dpkg",
                    "name": fields[1],
                    "version": fields[2],
                    "arch": fields[3],
                    "source": fields[4] or fields[1],
                    "source_version": fields[5] or fields[2],
                }
            )
        elif fields[0] == "FORGE-RPM" and len(fields) >= 8:
            packages.append(
                {
                    "manager": "rpm",
                    "name": fields[1],
                    "epoch": fields[2],
                    "version": fields[3],
                    "arch": fields[4],
                    "source": fields[5],
                    "license": fields[6],
                }
            )
        elif fields[0] == "FORGE-PY" and len(fields) >= 2:
            python = json.loads(line.split("\t", 1)[1])
    return os_release, packages, python


def _os_component(pkg: dict[str, str], distro_id: str, distro_tag: str) -> Component:
    if pkg["manager"] == "dpkg":
        purl = (
            f"pkg:deb/{distro_id}/{quote(pkg['name'], safe='')}@{_purl_version(pkg['version'])}"
            f"?arch={pkg['arch']}&distro={distro_tag}"
        )
        props: list[Property] = [{"name": "forge:source-package", "value": f"{pkg['source']} {pkg['source_version']}"}]
        licenses: list[License] = []
    else:
        epoch = f"&epoch={pkg['epoch']}" if pkg.get("epoch") not in {"", "0", "(none)"} else ""
        purl = (
            f"pkg:rpm/{distro_id}/{quote(pkg['name'], safe='')}@{_purl_version(pkg['version'])}"
            f"?arch={pkg['arch']}{epoch}&distro={distro_tag}"
        )
        props = [{"name": "forge:source-package", "value": pkg["source"]}]
        licenses = [{"license": {"name": pkg["license"]}}] if pkg.get("license") else []
    component: Component = {
        "type": "library",
        "bom-ref": purl,
        "name": pkg["name"],
        "version": pkg["version"],
        "purl": purl,
        "properties": [{"name": "forge:package-manager", "value": pkg["manager"]}, *props],
    }
    if licenses:
        component["licenses"] = licenses
    return component


def _py_component(dist: PythonDist, python_executable: str) -> Component:
    purl = f"pkg:pypi/{quote(_normal(dist['name']), safe='')}@{_purl_version(dist['version'])}"
    properties: list[Property] = [
        {"name": "forge:package-manager", "value": "python"},
        {"name": "forge:python-location", "value": dist["location"]},
        {"name": "forge:python-executable", "value": python_executable},
    ]
    if dist.get("installer"):
        properties.append({"name": "forge:python-installer", "value": dist["installer"]})
    component: Component = {
        "type": "library",
        "bom-ref": purl,
        "name": dist["name"],
        "version": dist["version"],
        "purl": purl,
        "properties": properties,
    }
    if expression := dist.get("license_expression"):
        component["licenses"] = [{"expression": expression}]
    elif name := dist.get("license"):
        component["licenses"] = [{"license": {"name": name}}]
    elif dist.get("classifiers"):
        component["licenses"] = [{"license": {"name": name}} for name in dist["classifiers"]]
    return component


def build_sbom(
    *,
    image_id: str,
    image_name: str,
    labels: dict[str, str],
    output: str,
    source_date_epoch: int | None,
    distro: str,
    target: str,
) -> Bom:
    """The CycloneDX document for an image, from its inventory output; pure, so it can be tested on text."""
    os_release, packages, python = parse_inventory(output)
    distro_id = os_release.get("ID", "unknown")
    distro_tag = f"{distro_id}-{os_release.get('VERSION_ID', '')}".rstrip("-")
    components = [_os_component(p, distro_id, distro_tag) for p in packages]
    if python:
        components += [_py_component(d, python["executable"]) for d in python["dists"]]
    seen: dict[str, int] = {}
    for component in sorted(components, key=lambda c: (c["bom-ref"], json.dumps(c, sort_keys=True))):
        ref = component["bom-ref"]
        seen[ref] = seen.get(ref, 0) + 1
        if seen[ref] > 1:  # the same project installed twice (system site and venv): refs must stay unique
            component["bom-ref"] = f"{ref}#{seen[ref]}"
    components.sort(key=lambda c: c["bom-ref"])
    if os_release:
        components.insert(
            0,
            {
                "type": "operating-system",
                "bom-ref": f"os:{distro_tag}",
                "name": distro_id,
                "version": os_release.get("VERSION_ID", ""),
                "description": os_release.get("PRETTY_NAME", ""),
            },
        )
    when = source_date_epoch if source_date_epoch is not None else 0
    image_ref = f"image:{image_id}"
    properties: list[Property] = [
        {"name": f"forge:label:{key}", "value": value} for key, value in sorted(labels.items())
    ]
    properties += [{"name": "forge:distro", "value": distro}, {"name": "forge:target", "value": target}]
    if python:
        properties.append({"name": "forge:python", "value": f"{python['executable']} {python['version']}"})
    return {
        "$schema": "http://cyclonedx.org/schema/bom-1.5.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'forge-sbom:{image_id}')}",
        "version": 1,
        "metadata": {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
            "tools": {"components": [{"type": "application", "name": "forge", "version": _forge_version()}]},
            "component": {
                "type": "container",
                "bom-ref": image_ref,
                "name": image_name,
                "version": image_id,
                "properties": properties,
            },
        },
        "components": components,
        "dependencies": [{"ref": image_ref, "dependsOn": [c["bom-ref"] for c in components]}],
    }


def image_inventory(engine: Engine, image: str) -> str:
    """Run the inventory script in a throwaway container of the image; it is removed whatever happens."""
    rc, out = engine.run_once(
        RunSpec(
            image=image,
            command=["-c", _SCRIPT],
            entrypoint=["/bin/sh"],
            env={"FORGE_PY": _PY_SCRIPT},
            network_host=False,
        ),
        timeout=300,
    )
    if rc != 0:
        raise EngineError(
            f"reading the package databases of {image} failed (exit {rc}): {out.strip()[-400:]}",
            hint="the image needs /bin/sh; check it starts with `docker run --entrypoint /bin/sh`",
        )
    return out


def write_sbom(
    engine: Engine,
    image: str,
    folder: Path,
    *,
    distro: str,
    target: str,
    source_date_epoch: int | None,
    name: str | None = None,
) -> SbomResult:
    """Generate the SBOM of `image` into folder/sbom.cdx.json; the result carries its sha256 for the report."""
    info = engine.image_info(image)
    output = image_inventory(engine, image)
    name = name or (sorted(info.tags)[0].rsplit(":", 1)[0] if info.tags else image)
    document = build_sbom(
        image_id=info.id,
        image_name=name,
        labels=info.labels,
        output=output,
        source_date_epoch=source_date_epoch,
        distro=distro,
        target=target,
    )
    text = json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SBOM_NAME
    path.write_text(text, encoding="utf-8")
    managers = [p["properties"][0]["value"] for p in document["components"] if p["type"] == "library"]
    return SbomResult(
        path=path,
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        components=len(document["components"]),
        os_packages=sum(1 for m in managers if m in {"dpkg", "rpm"}),
        python_packages=sum(1 for m in managers if m == "python"),
        package_manager=next((m for m in managers if m in {"dpkg", "rpm"}), "none"),
    )
