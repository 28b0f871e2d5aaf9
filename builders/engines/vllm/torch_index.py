"""Which torch wheels an index (PEP 691 JSON or PEP 503 HTML simple API, or a local folder) offers."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import requests
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

PEP691_JSON = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True, kw_only=True)
class IndexListing:
    url: str
    reachable: bool
    files: tuple[str, ...] = ()
    error: str | None = None


def project_url(index_url: str, project: str = "torch") -> str:
    """https://pypi.org/simple + torch -> https://pypi.org/simple/torch/ (an index URL may already name it)."""
    base = index_url.rstrip("/")
    if base.rsplit("/", 1)[-1] == project:
        return base + "/"
    return f"{base}/{project}/"


def parse_listing(body: str, content_type: str) -> list[str]:
    """File names from a simple-API page: JSON files[].filename (skipping yanked), or the anchors' hrefs."""
    if "json" in content_type:
        data = json.loads(body)
        return [f["filename"] for f in data.get("files", []) if not f.get("yanked")]
    names = []
    for href in re.findall(r"""<a\s[^>]*href=["']([^"']+)["']""", body, flags=re.IGNORECASE):
        names.append(unquote(urlsplit(href).path.rsplit("/", 1)[-1]))
    return names


@lru_cache(maxsize=16)
def fetch_listing(url: str, timeout: float = 10.0) -> IndexListing:
    """One GET of the project page. Unreachable is reported as such, never as an empty index."""
    try:
        resp = requests.get(url, headers={"Accept": f"{PEP691_JSON}, text/html;q=0.1"}, timeout=timeout)
    except requests.Timeout:
        return IndexListing(url=url, reachable=False, error=f"no answer within {timeout:g} s")
    except requests.RequestException as exc:
        host = urlsplit(url).hostname or url
        text = str(exc)
        if "resolve" in text or "Name or service not known" in text or "nodename nor servname" in text:
            reason = f"cannot resolve {host}"
        elif "refused" in text:
            reason = f"connection to {host} refused"
        else:
            reason = f"{type(exc).__name__} talking to {host}"
        return IndexListing(url=url, reachable=False, error=reason)
    if resp.status_code == 404:
        return IndexListing(url=url, reachable=True, files=())
    if resp.status_code != 200:
        return IndexListing(url=url, reachable=False, error=f"HTTP {resp.status_code}")
    try:
        files = parse_listing(resp.text, resp.headers.get("Content-Type", ""))
    except ValueError as exc:
        return IndexListing(url=url, reachable=False, error=f"unreadable index page: {exc}")
    return IndexListing(url=url, reachable=True, files=tuple(files))


def local_listing(folders: Sequence[Path]) -> IndexListing:
    label = ", ".join(str(f) for f in folders) or "(no folder)"
    existing = [f for f in folders if f.is_dir()]
    if not existing:
        return IndexListing(url=label, reachable=False, error="no such wheel folder")
    files = sorted(p.name for f in existing for p in f.glob("*.whl"))
    return IndexListing(url=label, reachable=True, files=tuple(files))


_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def _platform_ok(platform: str, arch: str, glibc: str | None = None) -> bool:
    """A Linux wheel for this arch whose manylinux glibc floor the distro's glibc meets."""
    if not platform.endswith(f"_{arch}"):
        return False
    if platform.startswith("linux_"):
        return True
    prefix = platform[: -len(arch) - 1]
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)", prefix)
    floor = (int(match.group(1)), int(match.group(2))) if match else _LEGACY_MANYLINUX.get(prefix)
    if floor is None:
        return False
    if glibc is None:
        return True
    have = tuple(int(x) for x in glibc.split(".")[:2])
    return have >= floor


def _python_ok(interpreter: str, abi: str, python: str) -> bool:
    cp = "cp" + python.replace(".", "")
    if interpreter == cp and abi in {cp, "abi3", "none"}:
        return True
    if abi == "abi3" and interpreter.startswith("cp3"):
        # abi3 wheels built for cp3X serve every later CPython 3.
        return int(interpreter[3:] or 0) <= int(cp[3:])
    return False


def matching_wheels(
    files: Sequence[str], *, project: str, version: str, python: str, arch: str, glibc: str | None = None
) -> list[str]:
    """Wheels pip would take for `project==version` on this CPython, arch and glibc.

    As in pip, ==2.13.0 admits 2.13.0+cpu, while ==2.14.0+cpu admits only that local version.
    """
    try:
        wanted = SpecifierSet(f"=={version}")
    except InvalidSpecifier:
        return []
    out = []
    for name in files:
        try:
            proj, ver, _build, tags = parse_wheel_filename(name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if proj != project or not wanted.contains(ver, prereleases=True):
            continue
        if any(_python_ok(t.interpreter, t.abi, python) and _platform_ok(t.platform, arch, glibc) for t in tags):
            out.append(name)
    return out


def versions_offered(files: Sequence[str], project: str) -> list[str]:
    seen: set[Version] = set()
    for name in files:
        try:
            proj, ver, _build, _tags = parse_wheel_filename(name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if proj == project:
            seen.add(ver)
    return [str(v) for v in sorted(seen)]


def pythons_offered(files: Sequence[str], *, project: str, version: str, arch: str) -> list[str]:
    """CPython tags (cp311, ...) the index has for this version and arch."""
    try:
        wanted = SpecifierSet(f"=={version}")
    except InvalidSpecifier:
        return []
    found: set[str] = set()
    for name in files:
        try:
            proj, ver, _build, tags = parse_wheel_filename(name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if proj == project and wanted.contains(ver, prereleases=True):
            found |= {t.interpreter for t in tags if _platform_ok(t.platform, arch)}
    return sorted(found)
