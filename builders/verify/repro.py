"""`forge verify-repro`: build one distro × target twice, the second time without cache, and compare.

Three steps over one VerifyRun (PHASES: first build → second build → compare), run by builders/runs.py's
skeleton, which untags the images afterwards (unless asked to keep them) and writes repro.json whatever ended the
run. Both builds go through the ordinary executor with the same inputs and SOURCE_DATE_EPOCH; the gates and the
test stage are skipped because they do not change the image. Both images are exported and compared layer by layer
(builders/repro/compare.py); files that differ are listed, and given to diffoscope when it is installed.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from builders import interrupt
from builders.build import BuildOptions, build
from builders.config.models import Distro, Recipe
from builders.container import Engine, connect
from builders.project import Project
from builders.records import write_text
from builders.repro.compare import ReproComparison, compare_images
from builders.repro.errors import InsufficientSpace
from builders.repro.image_export import ExportedImage, export_image, extract_paths, image_rootfs
from builders.runs import Phase, ended_by_signal, run_phases
from builders.verify.report import Images, ReproStopped, ReproVerdict

Sink = Callable[[str], None]
SPACE_FACTOR = 2.2
REPRO_FILES = ("repro.json", "repro.txt", "diffoscope.txt")


@dataclass(frozen=True, kw_only=True)
class VerifyOptions:
    strict_mtimes: bool = False
    keep_images: bool = False
    diffoscope_files: int = 10
    # What both builds are given (builder, jobs, sources, wheelhouse, report and scratch folders); verify-repro
    # sets the rest itself: no preflight, no test stage, no SBOM, its own tags, the second without cache.
    build: BuildOptions = field(default_factory=BuildOptions)


@dataclass(frozen=True, kw_only=True)
class VerifyResult:
    comparison: ReproComparison
    source_date_epoch: str | None
    images: tuple[str, str]
    report: Path
    diffoscope: Path | None


def _diffoscope(
    engine: Engine, comparison: ReproComparison, first: ExportedImage, second: ExportedImage, out: Path, limit: int
) -> Path | None:
    """diffoscope on the first `limit` files whose content differs; None when diffoscope is not installed."""
    tool = shutil.which("diffoscope")
    candidates = [d for d in comparison.differences if d.what in {"content", "size"}][:limit]
    if tool is None or not candidates:
        return None
    wanted_a: dict[str, set[str]] = {}
    wanted_b: dict[str, set[str]] = {}
    for d in candidates:
        wanted_a.setdefault(first.layers[d.layer].member, set()).add(d.path)
        wanted_b.setdefault(second.layers[d.layer].member, set()).add(d.path)
    text: list[str] = []
    with tempfile.TemporaryDirectory(prefix="forge-repro-") as tmp:
        (Path(tmp) / "a").mkdir()
        (Path(tmp) / "b").mkdir()
        got_a = extract_paths(engine, first.ref, wanted_a, Path(tmp) / "a")
        got_b = extract_paths(engine, second.ref, wanted_b, Path(tmp) / "b")
        for d in candidates:
            a = got_a.get((first.layers[d.layer].member, d.path))
            b = got_b.get((second.layers[d.layer].member, d.path))
            if a is None or b is None:
                continue
            proc = subprocess.run(
                [tool, "--text", "-", str(a), str(b)], capture_output=True, text=True, check=False, timeout=300
            )
            text.append(f"### layer {d.layer} {d.path}\n{proc.stdout or proc.stderr}")
    path = out / "diffoscope.txt"
    path.write_text("\n".join(text) + "\n")
    return path


def _check_space(engine: Engine, tag: str) -> None:
    """Stop before the second build when the engine's disk cannot hold it and the export of both images.

    The uncached build writes every layer again, and the engine's export (docker save) stages each image
    in its own tmp folder before streaming it: about twice the image on top of what is used now.
    """
    root = Path(engine.root_dir or "")
    if not engine.root_dir or not root.is_dir():
        return  # a remote engine: its disk cannot be seen from here
    size = engine.image_info(tag).size
    free = shutil.disk_usage(root).free
    if free < SPACE_FACTOR * size:
        raise InsufficientSpace(
            f"{root} has {free / 1e9:.1f} GB free; a second, uncached build of {tag} ({size / 1e9:.1f} GB) and "
            f"the export of both images need about {SPACE_FACTOR * size / 1e9:.1f} GB",
            hint="free space where the engine keeps its data (`docker builder prune` drops unused build cache)",
        )


@dataclass(kw_only=True)
class VerifyRun:
    """What verify-repro's steps share: the pair, the options, the two tags, the epoch the builds used, the
    comparison once made, and the verdict file's folder."""

    project: Project
    distro: Distro
    recipe: Recipe
    options: VerifyOptions
    sink: Sink
    engine: Engine
    out: Path
    epoch: str | None = None
    result: VerifyResult | None = None
    stopped: ReproStopped | None = None

    @property
    def repo(self) -> str:
        return f"forge/repro-{self.distro.name}-{self.recipe.target}"

    @property
    def tags(self) -> tuple[str, str]:
        return (f"{self.repo}:first", f"{self.repo}:second")

    # The skeleton's side (builders/runs.Run).
    def step(self, name: str) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def record_phase(self, name: str, seconds: float) -> None:
        """Each build's own report has its phases' seconds; repro.json keeps the fields it always had."""

    def record_end(self, error: BaseException | None, phase: str | None) -> None:
        if error is None:
            return
        # Ctrl-C, SIGTERM or SIGHUP (builders/interrupt.py), or a build that failed: the verdict file says so, and
        # which step was running (that build's own report, in its folder, says which of its phases).
        self.stopped = ReproStopped(
            distro=self.distro.name,
            target=self.recipe.target,
            result="interrupted" if isinstance(error, KeyboardInterrupt) else "failed",
            signal=ended_by_signal(error),
            ended_in=phase or "the start",
        )

    def write_report(self) -> None:
        if self.stopped is not None:
            self.stopped.save(self.out / "repro.json")
            state = self.stopped.result.upper()
            text = f"verify-repro {self.distro.name} {self.recipe.target}: {state} during {self.stopped.ended_in}\n"
            write_text(self.out / "repro.txt", text)

    def teardown(self, error: BaseException | None) -> None:
        if not self.options.keep_images:
            for tag in (*self.tags, f"{self.repo}:latest"):
                self.engine.untag(tag)

    def end_at_once(self, phase: str | None) -> None:
        if self.stopped is None and self.result is None:
            self.stopped = ReproStopped(
                distro=self.distro.name,
                target=self.recipe.target,
                result="interrupted",
                signal=interrupt.first_signal(),
                ended_in=phase or "the start",
            )
        self.write_report()


def _build(run: Literal["first", "second"]) -> Callable[[VerifyRun], None]:
    """One of the two builds: the same inputs, the second without cache; the gates and the test stage skipped,
    since they do not change the image."""

    def phase(ctx: VerifyRun) -> None:
        tag = ctx.tags[0 if run == "first" else 1]
        ctx.sink(f"forge: verify-repro: {run} build{' (--no-cache)' if run == 'second' else ''} → {tag}")
        report = build(
            ctx.project,
            ctx.distro,
            ctx.recipe,
            replace(
                ctx.options.build,
                skip_preflight=True,
                skip_tests=True,
                tag=tag,
                no_cache=run == "second",
                reports_dir=ctx.out / run,
                sbom=False,
            ),
            ctx.sink,
        )
        ctx.epoch = report.build_args.get("SOURCE_DATE_EPOCH", ctx.epoch)
        if run == "first":
            _check_space(ctx.engine, tag)

    return phase


def _compare(ctx: VerifyRun) -> None:
    ctx.sink("forge: verify-repro: exporting both images and comparing their layers")
    engine, tags = ctx.engine, ctx.tags
    base = image_rootfs(engine, ctx.distro.base.local_tag)
    first, second = export_image(engine, tags[0]), export_image(engine, tags[1])
    comparison = compare_images(first, second, base, strict_mtimes=ctx.options.strict_mtimes)
    diffoscope = None
    if not comparison.reproducible:
        diffoscope = _diffoscope(engine, comparison, first, second, ctx.out, ctx.options.diffoscope_files)
    verdict = verdict_of(ctx.distro.name, ctx.recipe.target, ctx.epoch, (first, second), comparison, diffoscope)
    path = verdict.save(ctx.out / "repro.json")
    write_text(ctx.out / "repro.txt", comparison.summary() + "\n")
    ctx.result = VerifyResult(
        comparison=comparison,
        source_date_epoch=ctx.epoch,
        images=(first.image_id, second.image_id),
        report=path,
        diffoscope=diffoscope,
    )


def verdict_of(
    distro: str,
    target: str,
    epoch: str | None,
    images: tuple[ExportedImage, ExportedImage],
    comparison: ReproComparison,
    diffoscope: Path | None,
) -> ReproVerdict:
    """What repro.json says of a comparison."""
    return ReproVerdict(
        distro=distro,
        target=target,
        source_date_epoch=epoch,
        images=Images(first=images[0].image_id, second=images[1].image_id),
        diffoscope=str(diffoscope) if diffoscope else None,
        **comparison.to_json().model_dump(),
    )


# verify-repro, in order; the teardown (untag both images unless --keep-images) is the skeleton's.
PHASES: tuple[Phase[VerifyRun], ...] = (
    Phase("first build", _build("first")),
    Phase("second build", _build("second")),
    Phase("compare", _compare),
)


def verify_repro(project: Project, distro: Distro, recipe: Recipe, options: VerifyOptions, sink: Sink) -> VerifyResult:
    engine = connect(options.build.engine)
    out = options.build.reports_dir or project.root / "reports" / f"{distro.name}-{recipe.target}" / "repro"
    out.mkdir(parents=True, exist_ok=True)
    # A verdict of an earlier run must not sit beside this run's build reports, whatever ends this one.
    for name in REPRO_FILES:
        (out / name).unlink(missing_ok=True)
    ctx = VerifyRun(project=project, distro=distro, recipe=recipe, options=options, sink=sink, engine=engine, out=out)
    run_phases(ctx, PHASES)
    assert ctx.result is not None, "the compare phase ran"
    return ctx.result
