"""Issue 9: `forge build` does the cheap checks first: engine, base, preflight, and only then the downloads.

Both builds run against the real engine with an empty source cache; the index is a loopback port nothing answers
on or a local server, so no byte leaves the host and the order is what is measured, not the network.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from builders.build import BuildOptions, build
from builders.container import Engine
from builders.errors import BaseUnavailable, PreflightBlocked
from builders.project import Project

pytestmark = [pytest.mark.engine]


def _refused() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_base_that_cannot_be_had_stops_the_build_before_any_download(
    project_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: Engine
) -> None:
    """Fedora 44 as on a fresh clone here: no registry, no dnf mirror. Nothing is fetched before that is known."""
    dead = _refused()
    yaml = project_copy / "distros" / "fedora-44.yaml"
    text = yaml.read_text()
    text = text.replace("image: registry.fedoraproject.org/fedora:44\n  digest", f"image: {dead}/fedora:44\n  digest")
    text = re.sub(r"mirror: \S+", f"mirror: http://{dead}/fedora/", text, count=1)
    text = text.replace("local_tag: forge/base:fedora-44", "local_tag: forge/test-missing-base:fedora-44")
    yaml.write_text(text)
    cache = tmp_path / "fresh-cache"
    monkeypatch.setenv("FORGE_CACHE", str(cache))
    monkeypatch.setenv("FORGE_PYPI_SIMPLE", f"http://{dead}/simple")
    project = Project.load(project_copy)
    with pytest.raises(BaseUnavailable):
        build(
            project,
            project.distro("fedora-44"),
            project.recipe_for("cpu"),
            BuildOptions(reports_dir=tmp_path / "report"),
            lambda _line: None,
        )
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert list(report["phases"]) == ["engine", "base"] and report["result"] == "failed"
    assert not cache.exists() or not any(cache.rglob("*"))


def test_a_blocking_gate_stops_the_build_before_the_other_sources(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: Engine
) -> None:
    """Debian 12 with the sdist already at hand: preflight blocks on GCC/CMake before oneDNN is fetched."""
    from builders.bootstrap import ensure_base

    fixture = Path(__file__).resolve().parents[1] / "preflight" / "fixtures" / "vllm-0.33.0"
    distro = project.distro("debian-12")
    ensure_base(distro, engine)
    cache = tmp_path / "fresh-cache"
    monkeypatch.setenv("FORGE_CACHE", str(cache))
    monkeypatch.setenv("FORGE_PYPI_SIMPLE", f"http://{_refused()}/simple")
    lines: list[str] = []
    with pytest.raises(PreflightBlocked) as raised:
        build(
            project,
            distro,
            project.recipe_for("cpu"),
            BuildOptions(reports_dir=tmp_path / "report", source_overrides={"vllm": fixture}),
            lines.append,
        )
    assert "gcc: GCC 12.2" in raised.value.message and "cmake: CMake 3.25" in raised.value.message
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert list(report["phases"]) == ["engine", "base", "preflight"] and report["result"] == "blocked"
    assert report["preflight"]["verdict"] == "blocked" and report["fetched_sources"] == []
    assert not cache.exists() or not any(cache.rglob("*")), "nothing may be fetched before preflight answers"
    assert "preflight: BLOCKED" in (tmp_path / "report" / "summary.txt").read_text()
