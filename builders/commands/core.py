"""forge list | render | plan | fetch | bootstrap | build | push."""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from builders.container import connect
from builders.container.base import EngineChoice
from builders.engines import ENGINES, make_plan
from builders.errors import SourceUnavailable, UsageError
from builders.log import Log, print_table
from builders.log import console as wide_console
from builders.options import BuildOptions, add_flags, cli_options, epoch_seconds, gpu_args_apply, plan_options
from builders.output import output_dir, write_output
from builders.plan import PlanOptions
from builders.platforms import PLATFORMS, Platform, for_platform, parse_platforms
from builders.project import Project
from builders.registry import parse_reference
from builders.render import render
from builders.target import Target


def _project(args: argparse.Namespace) -> Project:
    return Project.load(args.root)


def _selection(project: Project, distro: str | None, target: str | None) -> list[tuple[Any, Any]]:
    pairs = project.pairs()
    if distro:
        wanted = project.distro(distro).name
        pairs = [p for p in pairs if p[0].name == wanted]
    if target:
        recipe = project.recipe_for(target)
        pairs = [p for p in pairs if p[1].name == recipe.name]
    if not pairs:
        raise UsageError(
            f"no buildable pair for distro={distro or '*'} target={target or '*'}",
            hint="`forge list` shows every distro × target",
        )
    return pairs


def cmd_list(args: argparse.Namespace) -> int:
    project = _project(args)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "distro": d.name,
                        "target": r.target,
                        "recipe": r.name,
                        "family": d.family,
                        "default_for_family": d.default_for_family,
                    }
                    for d, r in project.pairs()
                ],
                indent=2,
            )
        )
        return 0
    rows = [
        (f"build-{d.name}-{r.target}", d.name, d.gcc, d.toolchain.python, d.toolchain.cmake, r.target, r.name)
        for d, r in project.pairs()
    ]
    print_table("distro × target", ("session", "distro", "gcc", "python", "cmake", "target", "recipe"), rows)
    return 0


def _plan_options(args: argparse.Namespace) -> PlanOptions:
    # Rendering without a build: two jobs, and the CA-bundle lines a build that finds one would get.
    options = BuildOptions.from_args(args)
    return replace(
        plan_options(options, options.max_jobs or 2), buildkit=options.builder != "legacy", trust_ca_bundle=True
    )


def _torch_pin(project: Project, target: Target, args: argparse.Namespace) -> str | None:
    """The torch pin the engine's pinned sdist states (fetched, sha256-checked, when the cache lacks it) so a
    Containerfile rendered without a build names the torch a build would install; never a placeholder."""
    recipe = target.recipe
    if args.torch_version or recipe.torch.version or not target.installs_torch:
        return None
    if not (recipe.source and recipe.source.pypi):
        return None  # the planner then refuses, naming --torch-version
    from builders.sources import cache_dir, fetch_sdist

    pin = recipe.source.pypi
    sdist = cache_dir(project.root) / f"{pin.name}-{pin.version}.tar.gz"
    if not sdist.exists():
        if getattr(args, "no_fetch", False):
            raise SourceUnavailable(
                f"{sdist}: not in the source cache; {recipe.target}'s torch version is read from it "
                f"(recipes/{recipe.name}.yaml pins none)",
                hint=f"`forge fetch {target.distro.name} {recipe.target} vllm`, drop --no-fetch, or pass "
                "--torch-version VERSION",
            )
        print(f"forge: fetching {sdist.name} to read vLLM's torch pin (--no-fetch: refuse instead)", file=sys.stderr)
        try:
            sdist = fetch_sdist(recipe, project.root).path
        except SourceUnavailable as exc:
            # The fetch's own hint names build's --source, which render and plan do not take.
            raise SourceUnavailable(
                f"{recipe.target}'s torch version is read from vLLM's sdist, which cannot be had: {exc.message}",
                hint=f"`forge fetch {target.distro.name} {recipe.target} vllm` where PyPI is reachable, or pass "
                "--torch-version VERSION",
            ) from None
    return ENGINES.of(recipe).source_pins(target, sdist).torch


def cmd_render(args: argparse.Namespace) -> int:
    project = _project(args)
    out = output_dir(Path(args.output))
    texts = {}
    pairs = _selection(project, args.distro, args.target)
    targets = [Target.resolve(distro, recipe) for distro, recipe in pairs]
    if not any(target.cuda for target in targets):
        # --gpu-mode / --cuda-arch-list shape GPU pairs only: with none selected they would change nothing.
        gpu_args_apply(targets[0], args)
    for distro, recipe in pairs:
        options = _plan_options(args)
        pin = _torch_pin(project, Target.resolve(distro, recipe), args)
        if pin:
            options = replace(options, torch_version=pin)
        plan = make_plan(distro, recipe, options)
        texts[out / f"{distro.name}-{recipe.target}.Containerfile"] = render(plan, project.containers_dir)
    # Written only once every pair rendered: a refusal leaves the folder's files as they were.
    written = []
    for path, text in texts.items():
        write_output(path, text)
        written.append(path)
    for path in written:
        print(path)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    project = _project(args)
    distro, recipe = project.distro(args.distro), project.recipe_for(args.target)
    target = Target.resolve(distro, recipe)
    gpu_args_apply(target, args)
    options = _plan_options(args)
    pin = _torch_pin(project, target, args)
    if pin:
        options = replace(options, torch_version=pin)
    plan = make_plan(distro, recipe, options)
    data = asdict(plan)
    data["distro"], data["recipe"] = distro.name, recipe.name
    print(json.dumps(data, indent=2, default=str))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from builders.sources import fetch_debian_source, fetch_sdist, fetch_wheelhouse

    project = _project(args)
    (plat,) = parse_platforms(args.platform)
    distro = for_platform(project.distro(args.distro), plat)
    recipe = project.recipe_for(args.target)
    wanted = set(args.sources or [])
    known = [
        *(["vllm"] if recipe.source and recipe.source.pypi else []),
        *(["wheelhouse"] if recipe.wheelhouse else []),
        *(f.name for f in recipe.fetched_sources),
    ]
    unknown = sorted(wanted - set(known))
    if unknown:
        # A typo (onedn) would otherwise fetch nothing and exit 0 without a word.
        close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.6)
        raise UsageError(
            f"{recipe.target} has no source {unknown[0]!r}" + (f" — did you mean {close[0]!r}?" if close else ""),
            hint=f"{recipe.target}'s sources: {', '.join(known) or 'none'} (recipes/{recipe.name}.yaml)",
        )
    if recipe.source and recipe.source.pypi and (not wanted or "vllm" in wanted):
        got = fetch_sdist(recipe, project.root)
        print(f"{recipe.source.pypi.name}: {got.path} ({got.origin})")
    if recipe.wheelhouse and (not wanted or "wheelhouse" in wanted):
        print(f"wheelhouse: {fetch_wheelhouse(recipe, distro, project.root, say=print)}")
    for fetched in recipe.fetched_sources:
        if wanted and fetched.name not in wanted:
            continue
        if fetched.debian_source:
            carrier = project.distro(fetched.debian_source_distro) if fetched.debian_source_distro else distro
            got = fetch_debian_source(fetched, carrier, connect(args.engine), project.root)
            print(f"{fetched.name}: {got.path} ({got.origin})")
        else:
            raise UsageError(
                f"{fetched.name}: only Debian's source package can be fetched by Forge for {distro.name}",
                hint=f"clone it yourself at the tag pinned in vLLM's {fetched.pinned_in} and pass "
                f"--source {fetched.name}=PATH",
            )
    return 0


def cmd_bootstrap(args: argparse.Namespace) -> int:
    from builders.bootstrap import bootstrap

    project = _project(args)
    for plat in parse_platforms(args.platform):
        distro = for_platform(project.distro(args.distro), plat)
        result = bootstrap(distro, connect(args.engine), source_date_epoch=args.source_date_epoch)
        print(
            f"{result.ref} {result.image_id} ({result.how} in {result.seconds:.1f}s, "
            f"rootfs sha256 {result.rootfs_sha256})"
        )
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from builders.build import build

    project = _project(args)
    distro, recipe = project.distro(args.distro), project.recipe_for(args.target)
    if not recipe.supports(distro.name):
        raise UsageError(
            f"recipes/{recipe.name}.yaml does not support {distro.name}",
            hint=f"its distros: {', '.join(recipe.distros)}",
        )
    gpu_args_apply(Target.resolve(distro, recipe), args)
    platforms = parse_platforms(args.platform)
    options = BuildOptions.from_args(args)
    if len(platforms) > 1 and options.reports_dir is not None:
        raise UsageError("--report-dir names one folder; several platforms write one report each")
    ref = parse_reference(args.push, what="--push") if args.push else None
    console = wide_console(highlight=False)
    for plat in platforms:
        status = console.status("forge: starting", spinner="dots")
        progress = BuildProgress()

        def seen(line: str, progress: BuildProgress = progress, status: Any = status) -> None:
            if progress.feed(line):
                status.update(progress.text())

        # --quiet hides the build's own output; Forge's steps, warnings and findings always show.
        log = Log(lambda line: console.print(line, markup=False, soft_wrap=True), quiet=args.quiet, on_line=seen)
        with status:
            report = build(project, for_platform(distro, plat), recipe, options, log)
        print(report.summary())
    if ref is not None:
        # The same path as `forge push`: the reports just written are what proves the images.
        return _push(project, distro, args.target, ref, platforms, options.reports_dir, options.engine)
    return 0


def _push(
    project: Project,
    distro: Any,
    target: str,
    ref: Any,
    platforms: tuple[Platform, ...],
    report_dir: Path | None,
    engine_choice: EngineChoice | None,
) -> int:
    from builders.build import default_reports_dir
    from builders.publish import proven, publish

    engine = connect(engine_choice)
    log = Log(lambda line: print(line, flush=True))
    images = [
        proven(engine, report_dir or default_reports_dir(project, for_platform(distro, p), target), p)
        for p in platforms
    ]
    for report in publish(engine, images, ref, log):
        print(report.summary())
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from builders.publish import index_of_digests

    ref = parse_reference(args.ref, what="REF")
    digests: dict[str, str] = {}
    for item in args.images:
        name, sep, digest = item.partition("=")
        (plat,) = parse_platforms(name) if sep else (None,)
        if plat is None or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise UsageError(f"{item!r}: expected PLATFORM=sha256:HEX, e.g. linux/arm64=sha256:…")
        digests[plat.name] = digest
    # Progress to stderr: stdout is the index alone (`forge index … --json > index.json`).
    index = index_of_digests(ref, digests, Log(lambda line: print(line, file=sys.stderr, flush=True)))
    print(index.to_json() if args.json else f"{index.ref}@{index.digest}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    project = _project(args)
    distro = project.distro(args.distro)
    project.recipe_for(args.target)  # an unknown target is named here, before the engine is asked
    platforms = parse_platforms(args.platform)
    report_dir = Path(args.report_dir).resolve() if args.report_dir else None
    if len(platforms) > 1 and report_dir is not None:
        raise UsageError("--report-dir names one folder; several platforms have one report each")
    ref = parse_reference(args.ref, what="REF")
    return _push(project, distro, args.target, ref, platforms, report_dir, args.engine)


class BuildProgress:
    """The live line under the streamed log: which stage runs, and how far ninja is through the compile."""

    STEP = re.compile(r"^#\d+ \[(?P<stage>[\w.-]+) +(?P<i>\d+)/(?P<n>\d+)\]")
    NINJA = re.compile(r"\[(?P<k>\d+)/(?P<total>\d+)\] (Building|Linking)")

    def __init__(self) -> None:
        self.stage = ""
        self.ninja = ""
        self.start = time.monotonic()

    def feed(self, line: str) -> bool:
        if m := self.STEP.match(line):
            self.stage, self.ninja = f"{m['stage']} step {m['i']}/{m['n']}", ""
            return True
        if m := self.NINJA.search(line):
            self.ninja = f"compile {m['k']}/{m['total']}"
            return True
        return line.startswith("forge:")

    def text(self) -> str:
        elapsed = time.monotonic() - self.start
        parts = [p for p in (self.stage, self.ninja) if p]
        return f"forge: {' · '.join(parts) or 'preparing'} · {elapsed / 60:.1f} min"


def _common_plan_args(p: argparse.ArgumentParser) -> None:
    add_flags(p, cli_options("plan"))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("list", help="every distro × target")
    p.add_argument("--json", action="store_true", help="print the pairs as JSON")
    p.set_defaults(func=cmd_list)

    p = subparsers.add_parser("render", help="render Containerfiles")
    p.add_argument("distro", nargs="?", help="only this distro (default: every one)")
    p.add_argument("target", nargs="?", help="only this target (default: every one)")
    p.add_argument("-o", "--output", default="rendered", help="folder for the Containerfiles (default: rendered)")
    _common_plan_args(p)
    _no_fetch_arg(p)
    p.set_defaults(func=cmd_render)

    p = subparsers.add_parser("plan", help="print the build plan (pure: no engine)")
    _distro_target_args(p)
    _common_plan_args(p)
    _no_fetch_arg(p)
    p.set_defaults(func=cmd_plan)

    p = subparsers.add_parser("fetch", help="store sources in the cache (vLLM sdist, oneDNN)")
    _distro_target_args(p)
    p.add_argument("sources", nargs="*", help="only these (vllm, onednn, wheelhouse)")
    p.add_argument("--platform", default=None, help="the wheelhouse's platform: linux/amd64 (default) or linux/arm64")
    p.set_defaults(func=cmd_fetch)

    p = subparsers.add_parser("bootstrap", help="build a base image from the distro's package archive")
    p.add_argument("distro", help=DISTRO_HELP)
    p.add_argument(
        "--source-date-epoch",
        type=epoch_seconds,
        default=None,
        metavar="SECONDS",
        help="timestamp for the base's files, for a reproducible rootfs (default: the archive snapshot's)",
    )
    _platform_arg(p)
    p.set_defaults(func=cmd_bootstrap)

    p = subparsers.add_parser("build", help="preflight, build, test and tag an image")
    _distro_target_args(p)
    add_flags(p, cli_options())
    p.add_argument("-q", "--quiet", action="store_true", help="only Forge's own lines, not the build output")
    _platform_arg(p)
    p.add_argument(
        "--push",
        metavar="REF",
        default=None,
        help="after the test stage passed, push to HOST[:PORT]/NAME[:TAG] (several platforms: one index)",
    )
    p.set_defaults(func=cmd_build)

    p = subparsers.add_parser("push", help="push an image already built and tested, by digest, with its SBOM")
    _distro_target_args(p)
    p.add_argument("ref", help="HOST[:PORT]/NAME[:TAG]; plain HTTP only for a loopback registry")
    _platform_arg(p)
    p.add_argument("--report-dir", default=None, help="the build's report folder (default: reports/DISTRO-TARGET)")
    p.set_defaults(func=cmd_push)

    p = subparsers.add_parser("index", help="one name for images pushed by digest: a manifest list / OCI index")
    p.add_argument("ref", help="HOST[:PORT]/NAME:TAG the index is stored under")
    p.add_argument("images", nargs="+", metavar="PLATFORM=DIGEST", help="linux/amd64=sha256:… linux/arm64=sha256:…")
    p.add_argument("--json", action="store_true", help="print the index record as JSON")
    p.set_defaults(func=cmd_index)


DISTRO_HELP = "distro (debian-12) or family (debian: its default release); `forge list` shows them"
TARGET_HELP = "target (cpu, cpu-wheel, router, gpu, ...)"


def _distro_target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("distro", help=DISTRO_HELP)
    p.add_argument("target", help=TARGET_HELP)


def _no_fetch_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-fetch",
        action="store_true",
        help="refuse, rather than download the pinned vLLM sdist, when vLLM's torch pin must be read from it",
    )


def _platform_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--platform",
        default=None,
        help=f"comma-separated, of {', '.join(PLATFORMS)} (default: linux/amd64); "
        "arm64 runs under qemu-user-static on an x86_64 host",
    )
