"""Issue 9: on an empty source cache preflight fetches the pinned sdist itself, and never says clear for a gate it
could not evaluate. PyPI is a real HTTP server on 127.0.0.1 serving the fixture as the pinned sdist (PEP 691)."""

from __future__ import annotations

import json
import re
import socket
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from builders.cli import main
from builders.errors import PreflightBlocked, PreflightIncomplete
from builders.gates.findings import PreflightReport, passed, unchecked
from builders.project import Project
from builders.report import BuildReport, PreflightSkipped
from builders.repro.ci import render_github, render_gitlab
from builders.sources import sha256_file

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-0.33.0"
pytestmark = pytest.mark.usefixtures("ample_disk")

SOURCE_GATES = {"gcc", "cmake", "python", "python-cmake", "fetched-source"}


@pytest.fixture
def sdist(tmp_path: Path) -> Path:
    path = tmp_path / "served" / "vllm-0.33.0.tar.gz"
    path.parent.mkdir()
    with tarfile.open(path, "w:gz") as tar:
        tar.add(FIXTURE, arcname="vllm-0.33.0")
    return path


@pytest.fixture
def pypi(sdist: Path) -> Iterator[str]:
    """A simple index answering /simple/vllm/ with the one sdist, and the file itself; returns the index URL."""
    digest = sha256_file(sdist)
    ports: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            host = f"http://127.0.0.1:{ports[0]}"
            if self.path == "/simple/vllm/":
                body = json.dumps(
                    {
                        "files": [
                            {"filename": sdist.name, "url": f"{host}/files/{sdist.name}", "hashes": {"sha256": digest}}
                        ]
                    }
                ).encode()
                kind = "application/vnd.pypi.simple.v1+json"
            elif self.path == f"/files/{sdist.name}":
                body, kind = sdist.read_bytes(), "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ports.append(server.server_port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/simple"
    finally:
        server.shutdown()
        server.server_close()


def _pinned_to(project_copy: Path, sdist: Path) -> Path:
    """The project with recipes/vllm-cpu.yaml pinning the served fixture's sha256 instead of the real sdist's."""
    recipe = project_copy / "recipes" / "vllm-cpu.yaml"
    text, n = re.subn(r"sha256: [0-9a-f]{64}", f"sha256: {sha256_file(sdist)}", recipe.read_text())
    assert n == 1
    recipe.write_text(text)
    return project_copy


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"  # nothing listens once the socket is closed: connection refused


def _preflight(root: Path, distro: str, scratch: Path, *extra: str) -> int:
    return main(
        ["--root", str(root), "preflight", distro, "cpu", "--no-probe", "--json", "--scratch-dir", str(scratch), *extra]
    )


def test_empty_cache_fetches_the_pin_and_debian_12_blocks_on_gcc_and_cmake(
    project_copy: Path,
    sdist: Path,
    pypi: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = _pinned_to(project_copy, sdist)
    cache = tmp_path / "fresh-cache"
    monkeypatch.setenv("FORGE_CACHE", str(cache))
    monkeypatch.setenv("FORGE_PYPI_SIMPLE", pypi)
    rc = _preflight(root, "debian-12", tmp_path)
    out = capsys.readouterr()
    assert rc == PreflightBlocked.exit_code == 3
    data = json.loads(out.out)
    blocking = {f["gate"]: f for f in data["findings"] if f["blocking"]}
    assert blocking["gcc"]["found"] == "GCC 12.2" and blocking["gcc"]["required"] == "≥ 12.3"
    assert blocking["gcc"]["source"].startswith("cmake/cpu_extension.cmake:")
    assert blocking["cmake"]["found"] == "CMake 3.25" and blocking["cmake"]["required"] == "≥ 3.26"
    assert blocking["cmake"]["source"].startswith("CMakeLists.txt:")
    assert data["verdict"] == "blocked" and data["vllm_version"] == "0.33.0"
    cached = cache / "sources" / "vllm-0.33.0.tar.gz"
    assert data["source"] == str(cached) and sha256_file(cached) == sha256_file(sdist)
    # The progress line goes to stderr so --json stays one document on stdout.
    assert "fetching vllm 0.33.0 sdist from PyPI" in out.err and "fetched vllm-0.33.0.tar.gz" in out.err


def test_unreachable_index_is_incomplete_never_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "fresh-cache"))
    monkeypatch.setenv("FORGE_PYPI_SIMPLE", _closed_port_url())
    root = Path(__file__).resolve().parents[2]
    rc = _preflight(root, "debian-13", tmp_path)
    out = capsys.readouterr()
    assert rc == PreflightIncomplete.exit_code == 9
    data = json.loads(out.out)
    assert data["verdict"] == "incomplete" and data["complete"] is False and not data["blocked"]
    assert set(data["not_evaluated"]) >= SOURCE_GATES
    gcc = next(f for f in data["findings"] if f["gate"] == "gcc")
    assert gcc["evaluated"] is False and "refused" in gcc["found"]
    assert not SOURCE_GATES & {f["gate"] for f in data["passed"]}
    assert "could not fetch vllm 0.33.0" in out.err
    assert not (tmp_path / "fresh-cache" / "sources" / "vllm-0.33.0.tar.gz").exists()
    # The opt-out changes the exit code, not the verdict.
    assert _preflight(root, "debian-13", tmp_path, "--allow-incomplete") == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "incomplete"


def test_a_sdist_whose_sha256_differs_from_the_pin_is_not_used(
    pypi: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The index serves the fixture, whose sha256 is not the real recipe's pin: nothing is read, nothing cached."""
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "fresh-cache"))
    monkeypatch.setenv("FORGE_PYPI_SIMPLE", pypi)
    rc = _preflight(Path(__file__).resolve().parents[2], "debian-13", tmp_path)
    data = json.loads(capsys.readouterr().out)
    assert rc == 9 and "gcc" in data["not_evaluated"]
    gcc = next(f for f in data["findings"] if f["gate"] == "gcc")
    assert "no file with sha256" in gcc["found"]
    assert not list((tmp_path / "fresh-cache" / "sources").glob("*.tar.gz"))


def test_no_fetch_leaves_the_source_gates_unevaluated(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "fresh-cache"))
    monkeypatch.setenv("FORGE_PYPI_SIMPLE", _closed_port_url())
    rc = _preflight(project.root, "debian-12", tmp_path, "--no-fetch")
    out = capsys.readouterr()
    data = json.loads(out.out)
    # Debian 12's host and declared facts block nothing without the source: the answer is incomplete, exit 9.
    assert rc == 9 and data["verdict"] == "incomplete" and set(data["not_evaluated"]) >= SOURCE_GATES
    assert "fetching" not in out.err


def test_torch_is_checked_on_the_index_the_build_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 15: `--torch-index` moves the torch-wheel gate to that index (here a wheelhouse folder: no network)."""
    house = tmp_path / "wheels"
    house.mkdir()
    (house / "torch-2.14.0-cp313-cp313-manylinux_2_28_x86_64.whl").write_bytes(b"")
    root = Path(__file__).resolve().parents[2]
    rc = _preflight(
        root,
        "debian-13",
        tmp_path,
        "--source",
        str(FIXTURE),
        "--torch-index",
        "wheelhouse",
        "--wheelhouse",
        str(house),
        "--allow-incomplete",
    )
    data = json.loads(capsys.readouterr().out)
    torch = next(f for f in data["passed"] if f["gate"] == "torch-wheel")
    assert rc == 0 and "wheelhouse" in torch["found"] and "torch-2.14.0-cp313" in torch["found"]


def test_build_summary_never_says_clear_for_an_unchecked_or_skipped_preflight(tmp_path: Path) -> None:
    report = BuildReport(distro="debian-13", target="cpu", recipe="vllm-cpu")
    report.preflight = PreflightReport.from_findings(
        [
            unchecked("torch-wheel", "index unreachable", "a torch wheel", "the index", "fetch it"),
            passed("gcc", "GCC 14.2", ">= 12.3", "cmake/cpu_extension.cmake"),
        ],
        distro="debian-13",
        target="cpu",
        recipe="vllm-cpu",
        mode="declared",
        seconds=0.1,
    )
    report.write(tmp_path)
    summary = (tmp_path / "summary.txt").read_text()
    assert "preflight: INCOMPLETE (not evaluated: torch-wheel; 1 passed)" in summary
    assert json.loads((tmp_path / "report.json").read_text())["preflight"]["complete"] is False
    report.preflight = PreflightSkipped(verdict="skipped", complete=False, why="--skip-preflight: no gate evaluated")
    assert "preflight: SKIPPED (--skip-preflight" in report.summary()


def test_ci_preflight_job_fails_on_incomplete_unless_opted_out(project: Project) -> None:
    for render in (render_github, render_gitlab):
        strict = render(project)
        assert "forge preflight" in strict and "--allow-incomplete" not in strict
        relaxed = render(project, allow_incomplete=True)
        assert "--json --allow-incomplete > reports/" in relaxed
        assert "--allow-incomplete-preflight" in relaxed.splitlines()[1]  # the regenerate line says how
