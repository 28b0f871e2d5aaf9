"""The executor: a list of phases over one Context (builders/context.py; PHASES: engine → base → preflight → sources →
lock → plan → caches → context → build → reuse (a source tree only) → cache-stats → inspect-toolchain → test → tag →
cache-export → sbom), cheapest first, each `phase(ctx) -> None`.

Only this module (through builders.container) changes engine state. A failed or interrupted build leaves no
container and no tag: the image is built untagged and tagged only after its test stage passed.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from builders import interrupt
from builders.bootstrap import BaseResult, ensure_base, ensure_image, registry_of
from builders.cache import phase as caches
from builders.config.models import Distro, FetchedSource, Recipe
from builders.container import BuildRequest, Engine, choose_builder, connect
from builders.container.base import RunSpec
from builders.container.image_builders import describe
from builders.context import Context
from builders.diagnose import diagnose_file
from builders.diagnose.diagnosis import diagnose_text
from builders.emulation import describe as describe_stand_in
from builders.engines import cuda_plan, make_plan
from builders.engines.checks import CheckResult
from builders.errors import BaseUnavailable, BuildFailed, PreflightBlocked, SourceUnavailable
from builders.gates.host import derive_max_jobs as derive_jobs
from builders.log import Log, as_log
from builders.options import BuildOptions as BuildOptions  # re-exported: callers build with it from here
from builders.options import plan_options
from builders.plan import BuildPlan, PlanOptions
from builders.platforms import platform_of
from builders.preflight.runner import run_preflight
from builders.project import Project
from builders.rebuild.devtree import read_manifest, write_manifest
from builders.render import render
from builders.report import (
    BaseImageRecord,
    BaseRecord,
    BuilderRecord,
    BuildReport,
    CheckRecord,
    EngineRecord,
    FetchedSourceRecord,
    ImageRecord,
    PlatformRecord,
    PreflightSkipped,
    SourceRecord,
    TorchRecord,
)
from builders.repro.integration import lock_phase, sbom_phase
from builders.repro.sbom import SBOM_NAME, sbom_label
from builders.sources import ResolvedSource, fetch_debian_source, resolve_fetched, resolve_sdist, wheelhouse_dir
from builders.target import Target
from builders.trust import find_ca_bundle

Sink = Callable[[str], None]


def derive_max_jobs(recipe: Recipe) -> int:
    # The RAM gate and the planner share one rule.
    return derive_jobs(per_job_gb=recipe.resources.ram_per_job_gb)


def _stage_context(ctx: Context) -> None:
    """Put into the context exactly what the plan names: hard links where possible, so a 5 GB wheelhouse is free."""
    folder, project, wheelhouse = ctx.context_dir, ctx.project, ctx.wheelhouse
    assert folder is not None
    shutil.copytree(project.containers_dir / "scripts", folder / "scripts")
    for item in ctx.plan.context:
        dest = folder / item.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if item.kind == "sdist":
            assert ctx.source is not None, "the sources phase resolves the pinned source the plan stages"
            _link_or_copy(ctx.source.path, dest)
        elif item.kind == "source-dir":
            # A fetched source by its name, else the recipe's own source given as a checkout.
            own = ctx.source if ctx.source is not None and ctx.source.path.is_dir() else None
            found = ctx.sources.get(dest.name) or own
            if found is None:
                raise SourceUnavailable(
                    f"the plan stages {item.name} ({item.origin}), and no such source was resolved",
                    hint=f"pass --source {dest.name}=PATH to a checkout of it",
                )
            shutil.copytree(found.path, dest, symlinks=True, ignore=shutil.ignore_patterns(".git", ".forge-origin"))
        elif item.kind == "wheelhouse":
            if wheelhouse is None:
                raise SourceUnavailable(
                    "this build needs a wheelhouse and none was given",
                    hint="pass --wheelhouse DIR (a folder of .whl files)",
                )
            dest.mkdir(exist_ok=True)
            for wheel in sorted(wheelhouse.glob("*.whl")):
                _link_or_copy(wheel, dest / wheel.name)
        elif item.kind == "package":
            shutil.copytree(
                project.root / "builders",
                dest / "builders",
                # A module compiled here (the router's C relay) is for this host's Python: the image builds its own.
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"),
            )
    if ctx.ca_bundle and not ctx.builder.supports_secrets:
        (folder / "trust").mkdir()
        shutil.copy2(ctx.ca_bundle, folder / "trust" / "ca_bundle.pem")
    if ctx.tree is not None:
        ctx.engine_of.stage_tree(ctx.tree, folder)


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def start(project: Project, distro: Distro, recipe: Recipe, options: BuildOptions, log: Log) -> Context:
    """The context of a new build: its report begun, its reports folder cleared of an earlier build's files."""
    report = BuildReport(distro=distro.name, target=recipe.target, recipe=recipe.name)
    reports_dir = options.reports_dir or default_reports_dir(project, distro, recipe.target)
    clear_report(reports_dir)
    ca_bundle, ca_origin = find_ca_bundle(options.ca_bundle)
    report.ca_bundle = f"{ca_bundle} ({ca_origin})" if ca_bundle else ca_origin
    if options.skip_preflight:
        report.preflight = PreflightSkipped(
            verdict="skipped", complete=False, why="--skip-preflight: no gate evaluated"
        )
    host = platform.machine()
    # Under emulation every RUN and every test-stage check is an arm64 process interpreted by qemu-user-static.
    report.platform = PlatformRecord(
        name=platform_of(distro).name,
        host=host,
        emulated=host != distro.arch,
        stand_in=describe_stand_in(distro.arch, host) or None,
    )
    return Context(
        project=project,
        distro=distro,
        recipe=recipe,
        options=options,
        log=log,
        report=report,
        reports_dir=reports_dir,
        max_jobs=options.max_jobs or recipe.max_jobs or derive_max_jobs(recipe),
        ca_bundle=ca_bundle,
        # A GPU build in wheel mode installs PyPI's CUDA wheel: no sdist to resolve, nothing compiled.
        target=Target.resolve(distro, recipe, gpu_mode=options.gpu_mode),
    )


@contextmanager
def in_phase(ctx: Context, name: str) -> Iterator[None]:
    """One build phase: the log announces, folds and times it; the report records its seconds."""
    ctx.running, ctx.phase_started = name, time.monotonic()
    with ctx.log.step(name), ctx.report.phase(name):
        yield


@contextmanager
def recorded(ctx: Context) -> Iterator[BuildReport]:
    """How the build ends, in one place whatever ends it: the outcome in the report (succeeded, or what stopped
    it and in which phase), an image built but not proven removed, the staged context deleted, the report
    written, and its summary shown when the build did not succeed."""
    ctx.report.write(ctx.reports_dir)  # from now on the folder names this build, even if it is killed outright
    with interrupt.on_second_signal(lambda: _ended_at_once(ctx)):
        try:
            yield ctx.report
            ctx.running = None
            ctx.report.result = "succeeded"
            ctx.image_id = None  # tagged: keep it
        except BaseException as exc:
            ctx.report.record_end(exc, ctx.running)
            if isinstance(exc, KeyboardInterrupt) and ctx.log_path.exists():
                # The log is an artifact of its own: it says why it stops short.
                with ctx.log_path.open("a", encoding="utf-8") as log_file:
                    log_file.write(f"\nforge: {ctx.report.error}\n")
            raise
        finally:
            _close(ctx)


def _close(ctx: Context) -> None:
    report = ctx.report
    report.ended_in = ctx.running
    unproven = ctx.image_id is not None and ctx.engine_ is not None
    if unproven:
        # Removed below: the report must not name it, nor its SBOM (written, if at all, for a tag now undone).
        report.image, report.sbom = None, None
        (ctx.reports_dir / SBOM_NAME).unlink(missing_ok=True)
    # Written before the engine is asked for anything: a second signal, which ends at once, leaves it true.
    report.write(ctx.reports_dir)
    if unproven:
        assert ctx.engine_ is not None and ctx.image_id is not None
        ctx.engine_.remove_image(ctx.image_id)  # built but not proven: no tag, no dangling image
    _remove_context(ctx)
    if report.result != "succeeded":
        ctx.log.info(f"report ({report.result}): {ctx.reports_dir / 'summary.txt'}\n{report.summary()}")


def _ended_at_once(ctx: Context) -> None:
    """A second signal ends Forge before its cleanup: the report still says how the build ended."""
    report = ctx.report
    if report.result == "running":
        report.result, report.signal = "interrupted", interrupt.first_signal()
        report.error = f"interrupted by {report.signal} during {ctx.running}"
    report.ended_in = ctx.running
    if ctx.running is not None:  # its step never ended: its time so far
        report.phases.setdefault(ctx.running, round(time.monotonic() - ctx.phase_started, 2))
    report.error = f"{report.error}; a second signal ended Forge before its cleanup"
    report.write(ctx.reports_dir)
    _remove_context(ctx)  # local files only: no engine call to wait for


def _remove_context(ctx: Context) -> None:
    if ctx.context_dir is not None and not ctx.options.keep_context:
        shutil.rmtree(ctx.context_dir, ignore_errors=True)


Phase = Callable[[Context], None]


def default_reports_dir(project: Project, distro: Distro, target: str) -> Path:
    """reports/DISTRO-TARGET, and reports/DISTRO-TARGET-arm64 for the same pair built for arm64."""
    return project.root / "reports" / f"{distro.name}-{target}{platform_of(distro).suffix}"


def build(project: Project, distro: Distro, recipe: Recipe, options: BuildOptions, sink: Log | Sink) -> BuildReport:
    """Run the phases in order over one context. Each phase is a log step and a report phase; how the build
    ends (its outcome, the cleanup, the report written whatever happened) is `recorded`'s."""
    ctx = start(project, distro, recipe, options, as_log(sink))
    with recorded(ctx) as report:
        for name, phase, runs in PHASES:
            if runs(ctx):
                with in_phase(ctx, name):
                    phase(ctx)
    return report


# What a build writes into its report folder. A new build removes them first, so the folder never holds one
# build's log or SBOM beside another's report (a CI job uploads the folder whatever happened).
REPORT_FILES = ("report.json", "summary.txt", "build.log", "toolchain.log", "Containerfile", SBOM_NAME)


def clear_report(folder: Path) -> None:
    """Only Forge's own files: the folder may be one the user named (--report-dir) and hold anything else."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:
        (folder / name).unlink(missing_ok=True)


def _engine(ctx: Context) -> None:
    ctx.engine_ = engine = connect(ctx.options.engine)
    ctx.builder_ = builder = choose_builder(engine, ctx.options.builder)
    ctx.report.engine = EngineRecord.model_validate(engine.facts.as_report())
    ctx.report.builder = BuilderRecord.model_validate(describe(builder))
    # A container that cannot start here fails now, named, not 90 s into the build or at its test stage.
    engine.check()
    version = f" {builder.version}" if builder.version else ""
    ctx.log.info(f"engine {engine.facts.describe()}; builder {builder.name}{version}")


def _base(ctx: Context) -> None:
    # Cheapest first (issue 9): a base that cannot be had, or a gate that blocks, stops the build before any
    # download; preflight fetches only the vLLM sdist its gates read, which the build needs anyway.
    distro = ctx.distro
    # A GPU image from PyPI's wheels sits on the distro's own base; only the CUDA-base distros need NVIDIA's.
    if ctx.target.cuda and not ctx.target.from_wheelhouse:
        ctx.base = _ensure_gpu_bases(ctx)
        return
    ctx.base = base = ensure_base(distro, ctx.engine)
    ctx.report.base = BaseRecord(
        ref=base.ref,
        image_id=base.image_id,
        how=base.how,
        rootfs_sha256=base.rootfs_sha256,
        declared=distro.base.pinned_ref,
    )
    ctx.log.info(f"base {base.ref} ({base.how})")


def _wheelhouse_at_hand(ctx: Context) -> Path | None:
    """--wheelhouse, else the cache folder `forge fetch` fills for wheel recipes (checked later, in sources)."""
    if ctx.options.wheelhouse is not None or ctx.recipe.wheelhouse is None:
        return ctx.options.wheelhouse
    return wheelhouse_dir(ctx.project.root, ctx.distro, ctx.recipe)


def _preflight(ctx: Context) -> None:
    """Every gate against the real base, the source (fetched when missing) and the index this build uses. Blocked
    stops the build; incomplete is said loudly and recorded, and the build goes on to find out for itself."""
    ctx.wheelhouse = _wheelhouse_at_hand(ctx)
    options, log = ctx.options, ctx.log
    pre = run_preflight(
        ctx.project,
        ctx.distro,
        ctx.recipe,
        engine=ctx.engine,
        source=options.source_overrides.get("vllm"),
        max_jobs=ctx.max_jobs,
        scratch_dir=options.scratch_dir or Path(tempfile.gettempdir()),
        wheelhouse=[ctx.wheelhouse] if ctx.wheelhouse else [],
        gpu_mode=options.gpu_mode,
        torch_index=options.torch_index,
        torch_version=options.torch_version,
        fetch=True,
        progress=log.info,
        given_sources={name: path for name, path in options.source_overrides.items() if name != "vllm"},
    )
    ctx.report.preflight = pre
    for finding in pre.findings:
        log.info(f"preflight {finding.gate}: {finding.found} vs {finding.required} ({finding.verdict})")
    log.info(f"{pre.summary()}")
    if pre.blocked:
        blocking = pre.blocking
        raise PreflightBlocked(
            f"{ctx.distro.name} {ctx.recipe.target}: "
            + "; ".join(f"{f.gate}: {f.found} vs {f.required} ({f.source})" for f in blocking),
            hint=blocking[0].remedy + " — or run with --skip-preflight to try anyway",
        )
    if not pre.complete:
        log.warning(
            f"preflight INCOMPLETE — not evaluated: {', '.join(pre.not_evaluated)}; "
            "the build goes on, and its report says so"
        )


def _sources(ctx: Context) -> None:
    """What the plan stages from the source cache: the recipe's pinned source (a tree given with --source split
    into the parts a rebuild reuses, where the engine builds one in layers), the sources CMake would fetch, and
    what the pinned source says about the build (its torch pin, its version)."""
    project, distro, recipe, report, engine = ctx.project, ctx.distro, ctx.recipe, ctx.report, ctx.engine_of
    if engine.stages_source(ctx.target):
        source = ctx.source = resolve_sdist(recipe, project.root, ctx.options.source_overrides)
        report.source = record = SourceRecord(origin=source.origin, sha256=source.sha256, path=str(source.path))
        ctx.tree = tree = engine.split_tree(source.path)
        if tree is not None:
            record.requirements_hash, record.package_hash = tree.requirements_hash, tree.package_hash
        for fetched in recipe.fetched_sources:
            resolved = _fetched_source(project, distro, fetched, ctx.engine, ctx.options, ctx.log)
            ctx.sources[fetched.name] = resolved
            report.fetched_sources.append(
                FetchedSourceRecord(
                    name=fetched.name, origin=resolved.origin, path=str(resolved.path), cmake_var=fetched.cmake_var
                )
            )
        pins = engine.source_pins(ctx.target, source.path)
        ctx.torch_pin, ctx.source_version = pins.torch, pins.version
    # The checkouts the engine's build needs beside its pinned source (sgl-kernel's CPU kernels), from --source
    # NAME=PATH: the engine says which, and names what to check out where one is missing.
    for checkout in engine.checkouts(ctx.target, ctx.options.source_overrides):
        ctx.sources[checkout.name] = checkout
        report.fetched_sources.append(
            FetchedSourceRecord(name=checkout.name, origin=checkout.origin, path=str(checkout.path), cmake_var=None)
        )
    staged = ([(recipe.engine, ctx.source)] if ctx.source else []) + list(ctx.sources.items())
    ctx.log.info(f"sources {', '.join(f'{k} ({v.origin})' for k, v in staged) or 'none needed'}")
    ctx.wheelhouse = wheelhouse = _wheelhouse_at_hand(ctx)
    if ctx.options.wheelhouse is None and wheelhouse is not None and not any(wheelhouse.glob("*.whl")):
        raise SourceUnavailable(
            f"no wheelhouse for {distro.name} {recipe.target} in {wheelhouse}",
            hint=f"run `forge fetch {distro.name} {recipe.target}` or pass --wheelhouse DIR",
        )
    if wheelhouse is not None:
        report.source = SourceRecord(
            origin=f"wheelhouse {wheelhouse}", wheels=sorted(p.name for p in wheelhouse.glob("*.whl"))
        )


def _lock(ctx: Context) -> None:
    ctx.epoch = lock_phase(
        ctx.project, ctx.distro, ctx.recipe, ctx.engine, ctx.report, ctx.options, ctx.wheelhouse, ctx.log
    )


def _plan(ctx: Context) -> None:
    options, base = ctx.options, ctx.base
    assert base is not None
    ctx.plan_ = plan = make_plan(
        ctx.distro,
        ctx.recipe,
        replace(
            plan_options(options, ctx.max_jobs),
            buildkit=ctx.builder.supports_secrets,
            trust_ca_bundle=ctx.ca_bundle is not None,
            torch_version=options.torch_version or ctx.torch_pin,
            vllm_version=ctx.source_version,
            base_digest=base.image_id,
            source_date_epoch=ctx.epoch,
            source_tree=ctx.tree is not None,
        ),
    )
    ctx.report.build_args = dict(plan.build_args)
    ctx.report.compile_env = dict(plan.compile_env)
    if plan.torch:
        ctx.report.torch = TorchRecord(
            requirement=plan.torch.requirement,
            index=plan.torch.index,
            index_url=plan.torch.index_url,
            cuda_build_on_cpu=plan.torch.cuda_build_on_cpu,
        )


def _context(ctx: Context) -> None:
    plan = ctx.plan
    ctx.context_dir = folder = Path(tempfile.mkdtemp(prefix="forge-context-", dir=ctx.options.scratch_dir))
    text = render(plan, ctx.project.containers_dir, compiler_cache=caches.template_launcher(ctx))
    (folder / plan.containerfile).write_text(text)
    (ctx.reports_dir / "Containerfile").write_text(text)
    ctx.report.containerfile = str(ctx.reports_dir / "Containerfile")
    _stage_context(ctx)


def _secrets(ctx: Context) -> dict[str, Path]:
    return {"ca_bundle": ctx.ca_bundle} if ctx.ca_bundle and ctx.builder.supports_secrets else {}


def _build(ctx: Context) -> None:
    plan, builder, folder = ctx.plan, ctx.builder, ctx.context_dir
    assert folder is not None
    result = caches.run_build(
        ctx,
        builder,
        BuildRequest(
            context_dir=folder,
            containerfile=folder / plan.containerfile,
            target=plan.final_stage,
            build_args=plan.build_args,
            secrets={**_secrets(ctx), **caches.build_secrets(ctx)},
            labels={**plan.labels, **sbom_label(ctx.distro.name, ctx.recipe.target)},
            no_cache=ctx.options.no_cache,
            log_path=ctx.log_path,
            platform=plan.platform,
            **caches.request_fields(ctx),
        ),
        ctx.log,
    )
    ctx.report.log = str(ctx.log_path)
    ctx.report.stage_seconds = result.step_times
    if not result.ok:
        _diagnose_into(ctx.report, ctx.log_path)
        raise BuildFailed(
            f"the {builder.name} build exited {result.returncode}; log: {ctx.log_path}",
            hint=ctx.report.diagnosis.remedy if ctx.report.diagnosis else "read the log's last error",
        )
    assert result.image_id is not None
    ctx.image_id = result.image_id


def _reuse(ctx: Context) -> None:
    """What each layer of a tree build reused (the engine reads it from the build's log), then this build's
    manifest for the next one in the same reports folder to compare with."""
    tree, plan = ctx.tree, ctx.plan
    assert tree is not None
    log = ctx.log_path.read_text(errors="replace") if ctx.log_path.exists() else ""
    ctx.report.reuse = section = ctx.engine_of.reuse(
        tree,
        log=log,
        plan=plan,
        base_image_id=ctx.report.base.image_id if ctx.report.base else "",
        cache_mounted=plan.buildkit and ctx.builder.supports_cache_mounts,
        previous=read_manifest(ctx.reports_dir),
    )
    for layer, part in (
        ("environment", section.environment),
        ("extension", section.extension),
        ("package", section.package),
    ):
        if part is not None:
            ctx.log.info(f"{layer}: {part.verdict}")
    write_manifest(ctx.reports_dir, tree, started=ctx.report.started)


def _inspect_toolchain(ctx: Context) -> None:
    # vLLM's source builds only: a native build's toolchain stage holds its whole compile, so inspecting it could
    # be a second compile wherever the layer cache missed.
    if ctx.target.compiles and ctx.context_dir is not None:
        ctx.report.versions.update(_toolchain_versions(ctx))


def _test(ctx: Context) -> None:
    assert ctx.image_id is not None
    checks = ctx.engine_of.checks(ctx.engine, ctx.image_id, ctx.plan)
    ctx.report.tests = [CheckRecord.model_validate(c.as_report()) for c in checks]
    for entry in ctx.report.tests:
        ctx.log.info(f"test {entry.name}: {entry.status_text()}")
    ctx.report.versions.update(ctx.engine_of.versions(checks))
    judge_checks(checks, ctx.report)


def judge_checks(checks: Sequence[CheckResult], report: BuildReport) -> None:
    """Raise BuildFailed naming the failed checks. Their output is diagnosed like a failed build's log: the report
    names the cause and remedy (a kernel library that cannot load beside this torch is torch-mismatch), or says
    that it knows none."""
    failed = [c for c in checks if not c.ok]
    if not failed:
        return
    detail = failed[0].detail.strip()
    diagnosis = diagnose_text("\n".join(c.detail for c in failed))
    report.diagnosis = diagnosis
    known = diagnosis.category != "unknown"
    raise BuildFailed(
        f"test stage failed: {', '.join(c.name for c in failed)}"
        + (f" ({diagnosis.category}: {' '.join(diagnosis.cause.split())})" if known else ""),
        hint=" ".join(diagnosis.remedy.split()) if known else (detail.splitlines()[-1] if detail else "see the report"),
    )


def _tag(ctx: Context) -> None:
    engine, image_id, tag = ctx.engine, ctx.image_id, ctx.plan.image_tag
    assert image_id is not None
    engine.tag(image_id, tag)
    # `:latest` names the newest proven image of this distro × target: smoke sessions start from it.
    engine.tag(image_id, tag.rsplit(":", 1)[0] + ":latest")
    info = engine.image_info(image_id)
    ctx.report.image = ImageRecord(id=info.id, tags=list(info.tags), size=info.size)
    if ctx.engine_of.runtime_python:
        ctx.report.versions.setdefault("python", _python_version(engine, tag))


def _sbom(ctx: Context) -> None:
    sbom_phase(ctx.engine, ctx.plan.image_tag, ctx.reports_dir, ctx.report, ctx.epoch, ctx.log)


def _always(_ctx: Context) -> bool:
    return True


def _tree(ctx: Context) -> bool:
    """A source tree (`--source vllm=DIR`), built in layers, whose reuse the report records (an sdist has no
    parts): known once the sources phase has split it."""
    return ctx.tree is not None


# The build, in order: (report/log name, phase, whether it runs: asked for by the options, or, for the reuse
# phase, given a tree by an earlier phase).
PHASES: tuple[tuple[str, Phase, Callable[[Context], bool]], ...] = (
    ("engine", _engine, _always),
    ("base", _base, _always),
    ("preflight", _preflight, lambda ctx: not ctx.options.skip_preflight),
    ("sources", _sources, _always),
    ("lock", _lock, _always),
    ("plan", _plan, _always),
    ("caches", caches.prepare, _always),
    ("context", _context, _always),
    ("build", _build, _always),
    ("reuse", _reuse, _tree),
    ("cache-stats", caches.record, _always),
    ("inspect-toolchain", _inspect_toolchain, _always),
    ("test", _test, lambda ctx: not ctx.options.skip_tests),
    ("tag", _tag, _always),
    ("cache-export", caches.export, _always),
    ("sbom", _sbom, lambda ctx: ctx.options.sbom),
)


def _fetched_source(
    project: Project, distro: Distro, fetched: FetchedSource, engine: Engine, options: BuildOptions, sink: Sink
) -> ResolvedSource:
    """The cache or an override; else fetch it now where Forge knows how (Debian's source package), since that
    takes seconds; else stop before the compile, naming both ways to provide it."""
    try:
        return resolve_fetched(fetched, project.root, options.source_overrides)
    except SourceUnavailable:
        if not fetched.debian_source:
            raise
    carrier = project.distro(fetched.debian_source_distro) if fetched.debian_source_distro else distro
    sink(f"forge: {fetched.name} not in the source cache: fetching Debian's `{fetched.debian_source}` source package")
    ensure_base(carrier, engine)
    return fetch_debian_source(fetched, carrier, engine, project.root)


def _diagnose_into(report: BuildReport, log_path: Path) -> None:
    report.diagnosis = diagnose_file(log_path)


def _ensure_gpu_bases(ctx: Context) -> BaseResult:
    """The plan's BASE_IMAGE and RUNTIME_IMAGE in the engine: the distro's own base as `forge bootstrap` makes it,
    a CUDA base local or pulled. Every missing one is named before the build stops; returns the runtime base."""
    distro, recipe, options, engine, report, sink = ctx.distro, ctx.recipe, ctx.options, ctx.engine, ctx.report, ctx.log
    cuda = cuda_plan(distro, recipe, options.gpu_mode)
    if cuda is None:  # no cuda section: the plan's own error names the fix
        make_plan(distro, recipe, PlanOptions(max_jobs=1, gpu_mode=options.gpu_mode))
        raise AssertionError("make_plan accepted a GPU target on a distro without a cuda section")
    wanted = {"BASE_IMAGE": cuda.devel_ref} if cuda.devel_ref else {}
    wanted["RUNTIME_IMAGE"] = cuda.runtime_ref
    got: dict[str, BaseResult] = {}
    problems: dict[str, BaseUnavailable] = {}
    for ref in dict.fromkeys(wanted.values()):
        try:
            got[ref] = ensure_base(distro, engine) if ref == distro.base.local_tag else ensure_image(engine, ref)
        except BaseUnavailable as exc:
            problems[ref] = exc
    if len(problems) == 1:
        raise next(iter(problems.values()))
    if problems:
        registries = " and ".join(dict.fromkeys(registry_of(ref) for ref in problems))
        raise BaseUnavailable(
            "\n".join(exc.message for exc in problems.values()),
            hint=f"pull {' and '.join(problems)} where {registries} is reachable, or `docker load` them",
        )
    for arg, ref in wanted.items():
        sink(f"forge: {arg} {ref} ({got[ref].how})")
    runtime = got[wanted["RUNTIME_IMAGE"]]
    report.base = BaseRecord(
        ref=runtime.ref,
        image_id=runtime.image_id,
        how=runtime.how,
        rootfs_sha256=runtime.rootfs_sha256,
        declared=wanted["RUNTIME_IMAGE"],
        images={
            arg: BaseImageRecord(ref=ref, image_id=got[ref].image_id, how=got[ref].how) for arg, ref in wanted.items()
        },
    )
    return runtime


def _toolchain_versions(ctx: Context) -> dict[str, str]:
    """The compiler, cmake and python as the compile saw them (plus nvcc for GPU builds): the toolchain stage is
    cached, so this costs seconds."""
    engine, plan, folder = ctx.engine, ctx.plan, ctx.context_dir
    assert folder is not None
    result = ctx.builder.build(
        BuildRequest(
            context_dir=folder,
            containerfile=folder / plan.containerfile,
            target="toolchain",
            build_args=plan.build_args,
            secrets=_secrets(ctx),
            log_path=ctx.log_path.with_name("toolchain.log"),
            platform=plan.platform,
        ),
        lambda _line: None,
    )
    if not result.ok or not result.image_id:
        return {}
    # The toolchain stage's image is shared with the final image's layers: inspect it, do not remove it.
    rc, out = engine.run_once(
        RunSpec(image=result.image_id, command=["-c", toolchain_script(plan)], entrypoint=["/bin/sh"]), timeout=60
    )
    return parse_toolchain(rc, out, plan)


def toolchain_script(plan: BuildPlan) -> str:
    """Shell printing `FORGE gcc|cmake|python|nvcc VERSION` for the compile's own tools."""
    # The compile's own C++ compiler (CXX: g++-14 beside Fedora 44's GCC 16 for nvcc), not whatever `gcc` is.
    cxx = plan.compile_env.get("CXX", "gcc")
    script = (
        f'echo "FORGE gcc $({shlex.quote(cxx)} -dumpfullversion)"; '
        "echo \"FORGE cmake $(cmake --version | head -n1 | sed 's/cmake version //')\"; "
        "echo \"FORGE python $(python3 -c 'import platform; print(platform.python_version())')\""
    )
    if plan.cuda is not None:
        script += "; echo \"FORGE nvcc $(nvcc --version | sed -n 's/.*release .*, V//p')\""
    return script


def parse_toolchain(rc: int, out: str, plan: BuildPlan) -> dict[str, str]:
    """The versions toolchain_script printed, and the CXX they describe; empty when any is missing."""
    found = {}
    for line in out.splitlines():
        key, _, value = line.removeprefix("FORGE ").partition(" ")
        if line.startswith("FORGE ") and value.strip():
            found[key] = value.strip()
    if rc != 0 or not {"gcc", "cmake", "python"} <= found.keys():
        return {}
    if "CXX" in plan.compile_env:
        found["cxx"] = plan.compile_env["CXX"]
    return found


def _python_version(engine: Engine, image: str) -> str:
    rc, out = engine.run_once(
        RunSpec(
            image=image, command=["-c", "import platform; print(platform.python_version())"], entrypoint=["python3"]
        ),
        timeout=60,
    )
    return out.strip().splitlines()[-1] if rc == 0 and out.strip() else "?"
