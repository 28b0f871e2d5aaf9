"""The caches phase's policy, on a real build context before any engine is asked for anything: a backend that
does not answer is a warning and the build goes on without it; refused credentials are an error before any
compile; --require-cache makes every warning an error (engine-free: the Redis is a stand-in speaking its protocol,
as much of it as Forge speaks before a build)."""

from __future__ import annotations

import socketserver
import stat
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from builders.build import BuildOptions, start
from builders.cache import phase
from builders.cache.errors import CacheCredentialsRejected, CacheRequired
from builders.cache.probe import probe
from builders.cache.secret import SECRET_ID
from builders.cache.settings import LOCAL, parse_compiler_cache
from builders.container.image_builders import BuildKitCliBuilder, LegacySdkBuilder
from builders.context import Context
from builders.engines import make_plan
from builders.engines.vllm.devtree import VLLM_LAYOUT
from builders.log import as_log
from builders.plan import PlanOptions
from builders.project import Project
from builders.rebuild.devtree import split_tree
from builders.registry.local import free_port


class _Resp(socketserver.StreamRequestHandler):
    """Redis's protocol, as much as the probe speaks: AUTH with the right password, PING."""

    password = "right-password"

    def handle(self) -> None:
        authed = False
        while True:
            header = self.rfile.readline()
            if not header:
                return
            words = []
            for _ in range(int(header[1:])):
                self.rfile.readline()
                words.append(self.rfile.readline().strip().decode())
            if words[0] == "AUTH":
                authed = words[-1] == self.password
                self.wfile.write(b"+OK\r\n" if authed else b"-WRONGPASS invalid username-password pair\r\n")
            elif words[0] == "PING":
                self.wfile.write(b"+PONG\r\n" if authed else b"-NOAUTH Authentication required.\r\n")


@pytest.fixture
def resp_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Resp)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _context(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], **options: object
) -> tuple[Context, list[str]]:
    for name in ("FORGE_COMPILER_CACHE", "FORGE_CACHE_REGISTRY", "FORGE_REQUIRE_CACHE", "SCCACHE_REDIS_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    tree = tmp_path / "vllm"
    for rel, text in {
        "setup.py": "",
        "csrc/a.cpp": "int a;\n",
        "requirements/cpu.txt": "",
        "vllm/__init__.py": "",
    }.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    lines: list[str] = []
    ctx = start(
        project,
        project.distro("debian-12"),
        project.recipe_for("cpu"),
        BuildOptions(reports_dir=tmp_path / "reports", scratch_dir=tmp_path, **options),  # type: ignore[arg-type]
        as_log(lines.append),
    )
    ctx.builder_ = BuildKitCliBuilder("/usr/bin/docker")
    ctx.tree = split_tree(tree, VLLM_LAYOUT)
    ctx.plan_ = make_plan(
        ctx.distro,
        ctx.recipe,
        PlanOptions(max_jobs=2, torch_version="2.14.0+cpu", vllm_version="0.33.0", source_tree=True, buildkit=True),
    )
    return ctx, lines


def test_a_redis_that_answers_gets_sccache_and_its_credentials_as_a_private_secret(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resp_server: int
) -> None:
    ctx, _ = _context(
        project,
        tmp_path,
        monkeypatch,
        {"SCCACHE_REDIS_PASSWORD": "right-password"},
        compiler_cache=f"redis://127.0.0.1:{resp_server}",
    )
    phase.prepare(ctx)
    assert ctx.cache is not None and ctx.cache.compiler.backend == "redis" and ctx.cache.warnings == []
    launcher = phase.template_launcher(ctx)
    assert launcher is not None and launcher.secret_id == SECRET_ID
    secret = phase.build_secrets(ctx)[SECRET_ID]
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and "right-password" in secret.read_text()
    assert not secret.is_relative_to(tmp_path / "reports")


def test_an_unreachable_redis_is_a_warning_naming_it_and_the_build_goes_on_with_ccache(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    ctx, lines = _context(project, tmp_path, monkeypatch, {"FORGE_COMPILER_CACHE": f"redis://127.0.0.1:{port}"})
    phase.prepare(ctx)
    assert ctx.cache is not None and ctx.cache.compiler == LOCAL and phase.template_launcher(ctx) is None
    (warning,) = ctx.cache.warnings
    assert f"redis://127.0.0.1:{port}" in warning and "unreachable" in warning and "compiles" in warning
    assert any("the build goes on" in line for line in lines)


def test_refused_credentials_stop_the_build_before_any_compile(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resp_server: int
) -> None:
    ctx, _ = _context(
        project,
        tmp_path,
        monkeypatch,
        {"SCCACHE_REDIS_PASSWORD": "wrong-password"},
        compiler_cache=f"redis://127.0.0.1:{resp_server}",
    )
    with pytest.raises(CacheCredentialsRejected) as info:
        phase.prepare(ctx)
    assert "redis" in info.value.message and "wrong-password" not in info.value.render()
    assert info.value.exit_code == 21


def test_require_cache_turns_every_warning_into_an_error(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, _ = _context(
        project,
        tmp_path,
        monkeypatch,
        {"FORGE_REQUIRE_CACHE": "1"},
        cache_registry=f"127.0.0.1:{free_port()}/forge-cache",
    )
    with pytest.raises(CacheRequired, match=r"cache registry .* unreachable") as info:
        phase.prepare(ctx)
    assert info.value.exit_code == 22


def test_a_builder_without_secrets_never_gets_the_credentials(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resp_server: int
) -> None:
    ctx, _ = _context(
        project,
        tmp_path,
        monkeypatch,
        {"SCCACHE_REDIS_PASSWORD": "right-password"},
        compiler_cache=f"redis://127.0.0.1:{resp_server}",
    )
    ctx.builder_ = LegacySdkBuilder(engine=object())  # type: ignore[arg-type]
    phase.prepare(ctx)
    assert ctx.cache is not None and ctx.cache.compiler == LOCAL and phase.build_secrets(ctx) == {}
    assert "no build secrets" in ctx.cache.warnings[0]


def test_no_cache_option_changes_nothing(project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, _ = _context(project, tmp_path, monkeypatch, {})
    phase.prepare(ctx)
    assert ctx.cache is None and phase.template_launcher(ctx) is None and phase.build_secrets(ctx) == {}


def test_a_template_without_the_launcher_says_so_and_compiles_with_ccache(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resp_server: int
) -> None:
    ctx, _ = _context(
        project,
        tmp_path,
        monkeypatch,
        {"SCCACHE_REDIS_PASSWORD": "right-password"},
        compiler_cache=f"redis://127.0.0.1:{resp_server}",
    )
    # Every compiling template Forge has takes the launcher; a new one is not wired until its compile step is.
    plan = make_plan(project.distro("debian-12"), project.recipe_for("llama-cpp"), PlanOptions(max_jobs=2))
    ctx.plan_ = replace(plan, template="new-engine.Containerfile.j2")
    phase.prepare(ctx)
    assert ctx.cache is not None and ctx.cache.compiler == LOCAL
    assert "not wired into new-engine.Containerfile.j2" in ctx.cache.warnings[0]


def test_the_probe_tells_a_working_redis_from_refused_credentials_and_from_none(resp_server: int) -> None:
    url = f"redis://127.0.0.1:{resp_server}"
    assert probe(parse_compiler_cache(url, {"SCCACHE_REDIS_PASSWORD": "right-password"})).verdict == "ok"
    refused = probe(parse_compiler_cache(url, {"SCCACHE_REDIS_PASSWORD": "wrong-password"}))
    assert refused.verdict == "rejected" and "WRONGPASS" in refused.detail and "wrong-password" not in refused.detail
    assert probe(parse_compiler_cache(url, {})).verdict == "rejected"  # NOAUTH: a password is needed
    closed = probe(parse_compiler_cache(f"redis://127.0.0.1:{free_port()}", {}))
    assert closed.verdict == "unreachable"
