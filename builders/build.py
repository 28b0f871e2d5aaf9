"""The executor: a list of phases over one Context (PHASES: engine → base → preflight → sources → lock → plan →
context → build → reuse (a source tree only) → inspect-toolchain → test → tag → sbom), cheapest first, each
`phase(ctx) -> None`.

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
from dataclasses import dataclass, field, replace
from pathlib import Path

from builders import devloop, interrupt
from builders.bootstrap import BaseResult, ensure_base, ensure_image, registry_of
from builders.config import Project
from builders.config.models import Distro, FetchedSource, Recipe
from builders.container import Builder, BuildRequest, Engine, choose_builder
from builders.container.base import RunSpec
from builders.container.image_builders import describe
from builders.diagnose import diagnose_file
from builders.diagnose.diagnosis import diagnose_text
from builders.emulation import describe as describe_stand_in
from builders.engines.checks import CheckResult, status_text
from builders.engines.vllm.gpu_wheel import run_gpu_wheel_checks
from builders.engines.vllm.image_tests import run_checks
from builders.errors import BaseUnavailable, BuildFailed, PreflightBlocked, SourceUnavailable
from builders.log import Log, as_log
from builders.options import BuildOptions as BuildOptions  # re-exported: callers build with it from here
from builders.options import plan_options
from builders.plan import BuildPlan, PlanOptions, make_plan
from builders.platforms import platform_of
from builders.preflight.host import derive_max_jobs as derive_jobs
from builders.preflight.runner import gpu_plan, run_preflight
from builders.preflight.source_facts import read_pins
from builders.rebuild.devtree import TreeSplit
from builders.render import render
from builders.report import BuildReport
from builders.repro.integration import lock_phase, sbom_phase
from builders.repro.sbom import SBOM_NAME, sbom_label
from builders.sources import ResolvedSource, fetch_debian_source, resolve_fetched, resolve_sdist, wheelhouse_dir
from builders.target import Target
from builders.trust import find_ca_bundle

Sink = Callable[[str], None]


def derive_max_jobs(recipe: Recipe) -> int:
    # The RAM gate and the planner share one rule.
    return derive_jobs(per_job_gb=recipe.resources.ram_per_job_gb)


def _stage_context(
    ctx: Path,
    project: Project,
    plan_items: list[tuple[str, str]],
    sources: dict[str, ResolvedSource],
    wheelhouse: Path | None,
    ca_bundle: Path | None,
    buildkit: bool,
) -> None:
    """Put into the context exactly what the plan names: hard links where possible, so a 5 GB wheelhouse is free."""
    shutil.copytree(project.containers_dir / "scripts", ctx / "scripts")
    for name, kind in plan_items:
        dest = ctx / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if kind == "sdist":
            _link_or_copy(sources["vllm"].path, dest)
        elif kind == "source-dir":
            src = sources[Path(name).name].path
            shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(".git", ".forge-origin"))
        elif kind == "wheelhouse":
            if wheelhouse is None:
                raise SourceUnavailable(
                    "this build needs a wheelhouse and none was given",
                    hint="pass --wheelhouse DIR (a folder of .whl files)",
                )
            dest.mkdir(exist_ok=True)
            for wheel in sorted(wheelhouse.glob("*.whl")):
                _link_or_copy(wheel, dest / wheel.name)
        elif kind == "package":
            shutil.copytree(
                project.root / "builders",
                dest / "builders",
                # A module compiled here (the router's C relay) is for this host's Python: the image builds its own.
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"),
            )
    if ca_bundle and not buildkit:
        (ctx / "trust").mkdir()
        shutil.copy2(ca_bundle, ctx / "trust" / "ca_bundle.pem")


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


@dataclass(kw_only=True)
class Context:
    """What the phases share: the inputs, the report they fill in, and what each phase leaves for the next."""

    project: Project
    distro: Distro
    recipe: Recipe
    options: BuildOptions
    log: Log
    report: BuildReport
    reports_dir: Path
    target: Target
    max_jobs: int
    ca_bundle: Path | None
    engine_: Engine | None = None
    builder_: Builder | None = None
    base: BaseResult | None = None
    wheelhouse: Path | None = None
    sources: dict[str, ResolvedSource] = field(default_factory=dict)
    tree: TreeSplit | None = None  # --source vllm=DIR: the tree split into the parts a rebuild reuses
    torch_pin: str | None = None
    vllm_version: str | None = None
    epoch: int | None = None
    plan_: BuildPlan | None = None
    context_dir: Path | None = None
    image_id: str | None = None  # built but not yet proven: removed unless the build gets to keep it
    running: str | None = None  # the phase under way, and since when
    phase_started: float = 0.0

    @classmethod
    def start(cls, project: Project, distro: Distro, recipe: Recipe, options: BuildOptions, log: Log) -> Context:
        report = BuildReport(distro=distro.name, target=recipe.target, recipe=recipe.name)
        reports_dir = options.reports_dir or default_reports_dir(project, distro, recipe.target)
        clear_report(reports_dir)
        ca_bundle, ca_origin = find_ca_bundle(options.ca_bundle)
        report.ca_bundle = f"{ca_bundle} ({ca_origin})" if ca_bundle else ca_origin
        if options.skip_preflight:
            report.preflight = {"verdict": "skipped", "complete": False, "why": "--skip-preflight: no gate evaluated"}
        host = platform.machine()
        # Under emulation every RUN and every test-stage check is an arm64 process interpreted by qemu-user-static.
        report.platform = {"name": platform_of(distro).name, "host": host, "emulated": host != distro.arch}
        stand_in = describe_stand_in(distro.arch, host)
        if stand_in:
            report.platform["stand_in"] = stand_in
        return cls(
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

    @property
    def compiles(self) -> bool:
        return self.target.compiles

    @property
    def engine(self) -> Engine:
        assert self.engine_ is not None, "the engine phase runs first"
        return self.engine_

    @property
    def builder(self) -> Builder:
        assert self.builder_ is not None, "the engine phase runs first"
        return self.builder_

    @property
    def plan(self) -> BuildPlan:
        assert self.plan_ is not None, "the plan phase runs before the stages that read it"
        return self.plan_

    @property
    def log_path(self) -> Path:
        return self.reports_dir / "build.log"

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """One build phase: the log announces, folds and times it; the report records its seconds."""
        self.running, self.phase_started = name, time.monotonic()
        with self.log.step(name), self.report.phase(name):
            yield

    @contextmanager
    def recorded(self) -> Iterator[BuildReport]:
        """How the build ends, in one place whatever ends it: the outcome in the report (succeeded, or what stopped
        it and in which phase), an image built but not proven removed, the staged context deleted, the report
        written, and its summary shown when the build did not succeed."""
        self.report.write(self.reports_dir)  # from now on the folder names this build, even if it is killed outright
        with interrupt.on_second_signal(self._ended_at_once):
            try:
                yield self.report
                self.running = None
                self.report.result = "succeeded"
                self.image_id = None  # tagged: keep it
            except BaseException as exc:
                self.report.record_end(exc, self.running)
                if isinstance(exc, KeyboardInterrupt) and self.log_path.exists():
                    # The log is an artifact of its own: it says why it stops short.
                    with self.log_path.open("a", encoding="utf-8") as log_file:
                        log_file.write(f"\nforge: {self.report.error}\n")
                raise
            finally:
                self._close()

    def _close(self) -> None:
        report = self.report
        report.ended_in = self.running
        unproven = self.image_id is not None and self.engine_ is not None
        if unproven:
            # Removed below: the report must not name it, nor its SBOM (written, if at all, for a tag now undone).
            report.image, report.sbom = {}, None
            (self.reports_dir / SBOM_NAME).unlink(missing_ok=True)
        # Written before the engine is asked for anything: a second signal, which ends at once, leaves it true.
        report.write(self.reports_dir)
        if unproven:
            assert self.engine_ is not None and self.image_id is not None
            self.engine_.remove_image(self.image_id)  # built but not proven: no tag, no dangling image
        self._remove_context()
        if report.result != "succeeded":
            self.log.info(f"report ({report.result}): {self.reports_dir / 'summary.txt'}\n{report.summary()}")

    def _ended_at_once(self) -> None:
        """A second signal ends Forge before its cleanup: the report still says how the build ended."""
        report = self.report
        if report.result == "running":
            report.result, report.signal = "interrupted", interrupt.first_signal()
            report.error = f"interrupted by {report.signal} during {self.running}"
        report.ended_in = self.running
        if self.running is not None:  # its step never ended: its time so far
            report.phases.setdefault(self.running, round(time.monotonic() - self.phase_started, 2))
        report.error = f"{report.error}; a second signal ended Forge before its cleanup"
        report.write(self.reports_dir)
        self._remove_context()  # local files only: no engine call to wait for

    def _remove_context(self) -> None:
        if self.context_dir is not None and not self.options.keep_context:
            shutil.rmtree(self.context_dir, ignore_errors=True)


Phase = Callable[[Context], None]


def default_reports_dir(project: Project, distro: Distro, target: str) -> Path:
    """reports/DISTRO-TARGET, and reports/DISTRO-TARGET-arm64 for the same pair built for arm64."""
    return project.root / "reports" / f"{distro.name}-{target}{platform_of(distro).suffix}"


def build(project: Project, distro: Distro, recipe: Recipe, options: BuildOptions, sink: Log | Sink) -> BuildReport:
    """Run the phases in order over one context. Each phase is a log step and a report phase; how the build
    ends (its outcome, the cleanup, the report written whatever happened) is `Context.recorded`'s."""
    ctx = Context.start(project, distro, recipe, options, as_log(sink))
    with ctx.recorded() as report:
        for name, phase, runs in PHASES:
            if runs(options):
                with ctx.phase(name):
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
    ctx.engine_ = engine = Engine.connect(ctx.options.engine)
    ctx.builder_ = builder = choose_builder(engine, ctx.options.builder)
    ctx.report.engine = engine.facts.as_report()
    ctx.report.builder = describe(builder)
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
        ctx.base = _ensure_gpu_bases(distro, ctx.recipe, ctx.options, ctx.engine, ctx.report, ctx.log)
        return
    ctx.base = base = ensure_base(distro, ctx.engine)
    ctx.report.base = {
        "ref": base.ref,
        "image_id": base.image_id,
        "how": base.how,
        "rootfs_sha256": base.rootfs_sha256,
        "declared": distro.base.pinned_ref,
    }
    ctx.log.info(f"base {base.ref} ({base.how})")


def _wheelhouse_at_hand(ctx: Context) -> Path | None:
    """--wheelhouse, else the cache folder `forge fetch` fills for wheel recipes (checked later, in sources)."""
    if ctx.options.wheelhouse is not None or ctx.recipe.wheelhouse is None:
        return ctx.options.wheelhouse
    return wheelhouse_dir(ctx.project.root, ctx.distro, ctx.recipe)


def _preflight(ctx: Context) -> None:
    ctx.wheelhouse = _wheelhouse_at_hand(ctx)
    _preflight_phase(
        ctx.project,
        ctx.distro,
        ctx.recipe,
        ctx.engine,
        ctx.options,
        ctx.max_jobs,
        ctx.wheelhouse,
        ctx.report,
        ctx.log,
    )


def _sources(ctx: Context) -> None:
    project, distro, recipe, report = ctx.project, ctx.distro, ctx.recipe, ctx.report
    if ctx.target.native:
        from builders.engines import native_engine

        # Another engine's pinned archive: staged as the plan's sdist, its version read by the engine's module.
        sdist = ctx.sources["vllm"] = resolve_sdist(recipe, project.root, ctx.options.source_overrides)
        report.source = {"origin": sdist.origin, "sha256": sdist.sha256, "path": str(sdist.path)}
        # And the checkouts its build needs beside it (sgl-kernel's CPU kernels): the engine names what is missing.
        for resolved in native_engine(recipe).sources(ctx.target, ctx.options.source_overrides):
            ctx.sources[resolved.name] = resolved
            report.fetched_sources.append(
                {"name": resolved.name, "origin": resolved.origin, "path": str(resolved.path)}
            )
    if ctx.compiles:
        vllm = ctx.sources["vllm"] = resolve_sdist(recipe, project.root, ctx.options.source_overrides)
        report.source = {"origin": vllm.origin, "sha256": vllm.sha256, "path": str(vllm.path)}
        if vllm.path.is_dir():
            ctx.tree = tree = devloop.split_source(vllm.path)
            report.source |= {"requirements_hash": tree.requirements_hash, "package_hash": tree.package_hash}
        for fetched in recipe.fetched_sources:
            resolved = _fetched_source(project, distro, fetched, ctx.engine, ctx.options, ctx.log)
            ctx.sources[fetched.name] = resolved
            report.fetched_sources.append(
                {
                    "name": fetched.name,
                    "origin": resolved.origin,
                    "path": str(resolved.path),
                    "cmake_var": fetched.cmake_var,
                }
            )
        ctx.torch_pin, ctx.vllm_version = read_pins(vllm.path, distro, ctx.target.device)
    ctx.log.info(f"sources {', '.join(f'{k} ({v.origin})' for k, v in ctx.sources.items()) or 'none needed'}")
    ctx.wheelhouse = wheelhouse = _wheelhouse_at_hand(ctx)
    if ctx.options.wheelhouse is None and wheelhouse is not None and not any(wheelhouse.glob("*.whl")):
        raise SourceUnavailable(
            f"no wheelhouse for {distro.name} {recipe.target} in {wheelhouse}",
            hint=f"run `forge fetch {distro.name} {recipe.target}` or pass --wheelhouse DIR",
        )
    if wheelhouse is not None:
        report.source = {
            "origin": f"wheelhouse {wheelhouse}",
            "wheels": sorted(p.name for p in wheelhouse.glob("*.whl")),
        }


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
            vllm_version=ctx.vllm_version,
            base_digest=base.image_id,
            source_date_epoch=ctx.epoch,
            source_tree=ctx.tree is not None,
        ),
    )
    ctx.report.build_args = dict(plan.build_args)
    ctx.report.compile_env = dict(plan.compile_env)
    if plan.torch:
        ctx.report.torch = {
            "requirement": plan.torch.requirement,
            "index": plan.torch.index,
            "index_url": plan.torch.index_url,
            "cuda_build_on_cpu": plan.torch.cuda_build_on_cpu,
        }


def _context(ctx: Context) -> None:
    plan = ctx.plan
    ctx.context_dir = folder = Path(tempfile.mkdtemp(prefix="forge-context-", dir=ctx.options.scratch_dir))
    text = render(plan, ctx.project.containers_dir)
    (folder / plan.containerfile).write_text(text)
    (ctx.reports_dir / "Containerfile").write_text(text)
    ctx.report.containerfile = str(ctx.reports_dir / "Containerfile")
    _stage_context(
        folder,
        ctx.project,
        [(i.name, i.kind) for i in plan.context],
        ctx.sources,
        ctx.wheelhouse,
        ctx.ca_bundle,
        ctx.builder.supports_secrets,
    )
    if ctx.tree is not None:
        devloop.stage_tree(ctx.tree, folder)


def _secrets(ctx: Context) -> dict[str, Path]:
    return {"ca_bundle": ctx.ca_bundle} if ctx.ca_bundle and ctx.builder.supports_secrets else {}


def _build(ctx: Context) -> None:
    plan, builder, folder = ctx.plan, ctx.builder, ctx.context_dir
    assert folder is not None
    result = builder.build(
        BuildRequest(
            context_dir=folder,
            containerfile=folder / plan.containerfile,
            target=plan.final_stage,
            build_args=plan.build_args,
            secrets=_secrets(ctx),
            labels={**plan.labels, **sbom_label(ctx.distro.name, ctx.recipe.target)},
            no_cache=ctx.options.no_cache,
            log_path=ctx.log_path,
            platform=plan.platform,
        ),
        ctx.log,
    )
    ctx.report.log = str(ctx.log_path)
    ctx.report.stage_seconds = result.step_times
    if not result.ok:
        _diagnose_into(ctx.report, ctx.log_path)
        raise BuildFailed(
            f"the {builder.name} build exited {result.returncode}; log: {ctx.log_path}",
            hint=(ctx.report.diagnosis or {}).get("remedy") or "read the log's last error",
        )
    assert result.image_id is not None
    ctx.image_id = result.image_id


def _inspect_toolchain(ctx: Context) -> None:
    if ctx.compiles and ctx.context_dir is not None:
        versions = _toolchain_versions(ctx.engine, ctx.builder, ctx.context_dir, ctx.plan, ctx.ca_bundle, ctx.log_path)
        ctx.report.versions.update(versions)


def _test(ctx: Context) -> None:
    assert ctx.image_id is not None
    if ctx.target.native:
        from builders.engines import native_engine

        checks = native_engine(ctx.recipe).checks(ctx.engine, ctx.image_id, ctx.plan)
    else:
        checks = run_checks(ctx.engine, ctx.image_id, ctx.plan)
    if ctx.target.cuda and ctx.target.from_wheelhouse:
        checks += run_gpu_wheel_checks(ctx.engine, ctx.image_id, ctx.plan)
    ctx.report.tests = [c.as_report() for c in checks]
    for entry in ctx.report.tests:
        ctx.log.info(f"test {entry['name']}: {status_text(entry)}")
    imported = next((c for c in checks if c.name == "import-vllm" and c.ok), None)
    if imported:
        vllm_v, torch_v = ([*imported.detail.split(), "", ""])[:2]
        ctx.report.versions.update({"vllm": vllm_v, "torch": torch_v})
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
    report.diagnosis = diagnosis.to_dict()
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
    ctx.report.image = {"id": info.id, "tags": list(info.tags), "size": info.size}
    if not ctx.target.native:
        # A native engine's runtime has no Python to ask (llama-server's image is one binary).
        ctx.report.versions.setdefault("python", _python_version(engine, tag))


def _sbom(ctx: Context) -> None:
    sbom_phase(ctx.engine, ctx.plan.image_tag, ctx.reports_dir, ctx.report, ctx.epoch, ctx.log)


def _always(_options: BuildOptions) -> bool:
    return True


def _tree_source(options: BuildOptions) -> bool:
    """--source vllm=DIR: a tree, built in layers, whose reuse the report records (an sdist has no parts)."""
    source = options.source_overrides.get("vllm")
    return source is not None and source.is_dir()


# The build, in order: (report/log name, phase, whether the options ask for it).
PHASES: tuple[tuple[str, Phase, Callable[[BuildOptions], bool]], ...] = (
    ("engine", _engine, _always),
    ("base", _base, _always),
    ("preflight", _preflight, lambda o: not o.skip_preflight),
    ("sources", _sources, _always),
    ("lock", _lock, _always),
    ("plan", _plan, _always),
    ("context", _context, _always),
    ("build", _build, _always),
    ("reuse", devloop.record_reuse, _tree_source),
    ("inspect-toolchain", _inspect_toolchain, _always),
    ("test", _test, lambda o: not o.skip_tests),
    ("tag", _tag, _always),
    ("sbom", _sbom, lambda o: o.sbom),
)


def _preflight_phase(
    project: Project,
    distro: Distro,
    recipe: Recipe,
    engine: Engine,
    options: BuildOptions,
    max_jobs: int,
    wheelhouse: Path | None,
    report: BuildReport,
    log: Log,
) -> None:
    """Every gate against the real base, the source (fetched when missing) and the index this build uses. Blocked
    stops the build; incomplete is said loudly and recorded, and the build goes on to find out for itself."""
    pre = run_preflight(
        project,
        distro,
        recipe,
        engine=engine,
        source=options.source_overrides.get("vllm"),
        max_jobs=max_jobs,
        scratch_dir=options.scratch_dir or Path(tempfile.gettempdir()),
        wheelhouse=[wheelhouse] if wheelhouse else [],
        gpu_mode=options.gpu_mode,
        torch_index=options.torch_index,
        torch_version=options.torch_version,
        fetch=True,
        progress=log.info,
        local_sources={k: v for k, v in options.source_overrides.items() if k != "vllm"},
    )
    report.preflight = pre.model_dump(mode="json")
    for finding in pre.findings:
        log.info(f"preflight {finding.gate}: {finding.found} vs {finding.required} ({finding.verdict})")
    log.info(f"{pre.summary()}")
    if pre.blocked:
        blocking = pre.blocking
        raise PreflightBlocked(
            f"{distro.name} {recipe.target}: "
            + "; ".join(f"{f.gate}: {f.found} vs {f.required} ({f.source})" for f in blocking),
            hint=blocking[0].remedy + " — or run with --skip-preflight to try anyway",
        )
    if not pre.complete:
        log.warning(
            f"preflight INCOMPLETE — not evaluated: {', '.join(pre.not_evaluated)}; "
            "the build goes on, and its report says so"
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
    report.diagnosis = diagnose_file(log_path).to_dict()


def _ensure_gpu_bases(
    distro: Distro,
    recipe: Recipe,
    options: BuildOptions,
    engine: Engine,
    report: BuildReport,
    sink: Sink,
) -> BaseResult:
    """The plan's BASE_IMAGE and RUNTIME_IMAGE in the engine: the distro's own base as `forge bootstrap` makes it,
    a CUDA base local or pulled. Every missing one is named before the build stops; returns the runtime base."""
    cuda = gpu_plan(distro, recipe, options.gpu_mode)
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
    report.base = {
        "ref": runtime.ref,
        "image_id": runtime.image_id,
        "how": runtime.how,
        "rootfs_sha256": runtime.rootfs_sha256,
        "declared": wanted["RUNTIME_IMAGE"],
        "images": {
            arg: {"ref": ref, "image_id": got[ref].image_id, "how": got[ref].how} for arg, ref in wanted.items()
        },
    }
    return runtime


def _toolchain_versions(
    engine: Engine, builder: Builder, ctx: Path, plan: BuildPlan, ca_bundle: Path | None, log_path: Path
) -> dict[str, str]:
    """The compiler, cmake and python as the compile saw them (plus nvcc for GPU builds): the toolchain stage is
    cached, so this costs seconds."""
    result = builder.build(
        BuildRequest(
            context_dir=ctx,
            containerfile=ctx / plan.containerfile,
            target="toolchain",
            build_args=plan.build_args,
            secrets={"ca_bundle": ca_bundle} if ca_bundle and builder.supports_secrets else {},
            log_path=log_path.with_name("toolchain.log"),
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
