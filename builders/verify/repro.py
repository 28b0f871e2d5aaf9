"""`forge verify-repro`: build one distro × target twice, the second time without cache, and compare.

Both builds go through the ordinary executor with the same inputs and SOURCE_DATE_EPOCH; the gates and
the test stage are skipped because they do not change the image. Both images are exported and compared
layer by layer (builders/repro/compare.py); files that differ are listed, and given to diffoscope when
it is installed. The images are untagged afterwards unless asked to keep them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from builders import interrupt
from builders.build import BuildOptions, build
from builders.config.models import Distro, Recipe
from builders.container import Engine, connect
from builders.project import Project
from builders.repro.compare import ReproComparison, compare_images
from builders.repro.errors import InsufficientSpace
from builders.repro.image_export import export_image, extract_paths, image_rootfs

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
    engine: Engine, comparison: ReproComparison, first: Any, second: Any, out: Path, limit: int
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


def verify_repro(project: Project, distro: Distro, recipe: Recipe, options: VerifyOptions, sink: Sink) -> VerifyResult:
    engine = connect(options.build.engine)
    out = options.build.reports_dir or project.root / "reports" / f"{distro.name}-{recipe.target}" / "repro"
    out.mkdir(parents=True, exist_ok=True)
    # A verdict of an earlier run must not sit beside this run's build reports, whatever ends this one.
    for name in REPRO_FILES:
        (out / name).unlink(missing_ok=True)
    repo = f"forge/repro-{distro.name}-{recipe.target}"
    tags = (f"{repo}:first", f"{repo}:second")
    epoch: str | None = None
    step = "first build"
    try:
        for run, tag in zip(("first", "second"), tags, strict=True):
            step = f"{run} build"
            sink(f"forge: verify-repro: {run} build{' (--no-cache)' if run == 'second' else ''} → {tag}")
            report = build(
                project,
                distro,
                recipe,
                replace(
                    options.build,
                    skip_preflight=True,
                    skip_tests=True,
                    tag=tag,
                    no_cache=run == "second",
                    reports_dir=out / run,
                    sbom=False,
                ),
                sink,
            )
            epoch = report.build_args.get("SOURCE_DATE_EPOCH", epoch)
            if run == "first":
                _check_space(engine, tag)
        step = "compare"
        sink("forge: verify-repro: exporting both images and comparing their layers")
        base = image_rootfs(engine, distro.base.local_tag)
        first, second = export_image(engine, tags[0]), export_image(engine, tags[1])
        comparison = compare_images(first, second, base, strict_mtimes=options.strict_mtimes)
        diffoscope = None
        if not comparison.reproducible:
            diffoscope = _diffoscope(engine, comparison, first, second, out, options.diffoscope_files)
        data = {
            "distro": distro.name,
            "target": recipe.target,
            "source_date_epoch": epoch,
            "images": {"first": first.image_id, "second": second.image_id},
            "diffoscope": str(diffoscope) if diffoscope else None,
            **comparison.to_json(),
        }
        path = out / "repro.json"
        path.write_text(json.dumps(data, indent=2) + "\n")
        (out / "repro.txt").write_text(comparison.summary() + "\n")
        return VerifyResult(
            comparison=comparison,
            source_date_epoch=epoch,
            images=(first.image_id, second.image_id),
            report=path,
            diffoscope=diffoscope,
        )
    except KeyboardInterrupt as exc:
        # Ctrl-C, SIGTERM or SIGHUP (builders/interrupt.py): the verdict file says so, and which step was running
        # (that build's own report, in its folder, says which of its phases).
        interrupted = {"distro": distro.name, "target": recipe.target, "result": "interrupted"}
        interrupted |= {"signal": interrupt.signal_of(exc), "ended_in": step}
        (out / "repro.json").write_text(json.dumps(interrupted, indent=2) + "\n")
        (out / "repro.txt").write_text(f"verify-repro {distro.name} {recipe.target}: INTERRUPTED during {step}\n")
        raise
    finally:
        if not options.keep_images:
            for tag in (*tags, f"{repo}:latest"):
                engine.untag(tag)
