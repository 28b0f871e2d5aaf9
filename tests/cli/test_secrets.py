"""A secret given to Forge never comes out of it: the CLI paths that take a password or key run with a known one,
and every byte they print and every file they write is searched for it.

Where a secret goes in: a URL's user-info (--endpoint, FORGE_PYPI_SIMPLE, a distro's mirror), --api-key and
FORGE_API_KEY. Where it could come out: an error message, a log line, a report, a rendered file, argparse's
complaint about a flag, a diagnosis quoting a log line.
"""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from builders.cli import main
from builders.redact import mask_urls

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Sup3rS3cretKey"


class _Endpoint(http.server.BaseHTTPRequestHandler):
    """/health answers; /v1/models answers what the test sets: 401 to any key, or a list without the model."""

    models_status = 401

    def do_GET(self) -> None:
        if self.path.endswith("/health"):
            body, status = b"{}", 200
        else:
            status = self.models_status
            body = json.dumps({"data": [{"id": "another-model"}]}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[tuple[str, type[_Endpoint]]]:
    handler = type("Handler", (_Endpoint,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return code, out + err


def written(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def assert_kept(output: str, folder: Path) -> None:
    assert SECRET not in output, output
    leaked = [path for path, data in written(folder).items() if SECRET.encode() in data]
    assert leaked == []


def test_mask_urls_masks_the_whole_user_info() -> None:
    assert mask_urls(f"see http://admin:{SECRET}@host:8/v1 and https://h/a@b") == (
        "see http://***@host:8/v1 and https://h/a@b"
    )
    assert SECRET not in mask_urls(f"https://user:p@{SECRET}@host/")  # a raw @ in the password


def test_an_endpoint_password_and_key_never_come_out(
    tmp_path: Path,
    endpoint: tuple[str, type[_Endpoint]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    host, handler = endpoint
    report = tmp_path / "reports"
    outputs = []
    # Refused key (401), then a model list without the profile's model, then nothing listening at all.
    handler.models_status = 401
    code, out = run(capsys, "smoke", "--endpoint", f"http://admin:{SECRET}@{host}/", "--api-key", SECRET,
                    "--report", str(report))  # fmt: skip
    assert code == 8 and "refused the API key" in out, out
    outputs.append(out)
    handler.models_status = 200
    monkeypatch.setenv("FORGE_API_KEY", SECRET)
    code, out = run(capsys, "smoke", "--endpoint", f"http://admin:{SECRET}@{host}", "--report", str(report))
    assert code == 8 and "does not serve model" in out, out
    outputs.append(out)
    code, out = run(capsys, "smoke", "--endpoint", f"http://admin:{SECRET}@127.0.0.1:9/", "--report", str(report))
    assert code == 8 and "cannot be reached" in out and "http://***@127.0.0.1:9" in out, out
    outputs.append(out)
    # A malformed key and a malformed URL are refused without quoting the secret either.
    code, out = run(capsys, "smoke", "--endpoint", f"http://admin:{SECRET}@[::1", "--api-key", f"{SECRET}\n")
    assert code == 2, out
    outputs.append(out)
    assert_kept("\n".join(outputs), tmp_path)


def test_a_package_index_password_never_comes_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FORGE_PYPI_SIMPLE", f"http://user:{SECRET}@127.0.0.1:9/simple")
    code, out = run(capsys, "render", "debian-12", "cpu", "-o", str(tmp_path / "out"))
    assert code == 4 and "http://***@127.0.0.1:9/simple" in out, out
    assert_kept(out, tmp_path)


def test_a_mirror_password_stays_out_of_rendered_files_and_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    for sub in ("distros", "recipes", "containers"):
        shutil.copytree(ROOT / sub, root / sub)
    distro = root / "distros" / "debian-13.yaml"
    distro.write_text(
        distro.read_text().replace("http://deb.debian.org/debian", f"http://mirror:{SECRET}@deb.debian.org/debian")
    )
    code, out = run(capsys, "--root", str(root), "render", "debian-13", "-o", str(tmp_path / "out"),
                    "--torch-version", "2.9.1")  # fmt: skip
    assert code == 0, out
    code, plan = run(capsys, "--root", str(root), "plan", "debian-13", "cpu-wheel")
    assert code == 0, plan
    assert_kept(out + plan, tmp_path / "out")


def test_argparse_and_diagnose_quote_urls_masked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "render", "--max-jobs", f"http://u:{SECRET}@h/")
    assert code == 2 and "http://***@h/" in out, out
    log = tmp_path / "build.log"
    log.write_text(
        "Step 4/4 : RUN pip install vllm\n"
        f"Looking in indexes: https://ci:{SECRET}@pypi.internal/simple\n"
        f"ERROR: Could not find a version that satisfies the requirement vllm (from https://ci:{SECRET}@pypi.internal)\n"
    )
    code, diagnosis = run(capsys, "diagnose", str(log), "--json")
    assert code == 0 and "https://***@pypi.internal" in diagnosis, diagnosis  # the decisive line, masked
    assert_kept(out + diagnosis, tmp_path / "nothing-written")
