"""forge verify-repro: build a pair twice and compare the images.

Apart from builders/repro/ because it runs builds, and a build uses repro's lock and SBOM phases: in one
package the two would import each other.
"""

from __future__ import annotations

import argparse

from builders import log
from builders.options import BuildOptions, add_flags, cli_options
from builders.repro.command import pair_from, project_from
from builders.repro.errors import NotReproducible

# The build options verify-repro passes on to both builds, with the flags `forge build` spells them with.
VERIFY_BUILD_OPTIONS = {"builder", "max_jobs", "source_overrides", "wheelhouse", "reports_dir", "scratch_dir"}


def cmd_verify_repro(args: argparse.Namespace) -> int:
    from builders.verify.repro import VerifyOptions, verify_repro

    project = project_from(args)
    distro, recipe = pair_from(project, args.distro, args.target)
    console = log.console(highlight=False)
    quiet = args.quiet

    def sink(line: str) -> None:
        if not quiet or line.startswith("forge:"):
            console.print(line, markup=False, soft_wrap=True)

    result = verify_repro(
        project,
        distro,
        recipe,
        VerifyOptions(
            strict_mtimes=args.strict_mtimes, keep_images=args.keep_images, build=BuildOptions.from_args(args)
        ),
        sink,
    )
    print(result.comparison.summary())
    print(
        f"  SOURCE_DATE_EPOCH={result.source_date_epoch}; report: {result.report}"
        + (f"; diffoscope: {result.diffoscope}" if result.diffoscope else "")
    )
    if not result.comparison.reproducible:
        raise NotReproducible(
            f"{distro.name} {recipe.target}: {len(result.comparison.differences)} path(s) differ between two builds "
            f"of the same inputs (listed above and in {result.report})",
            hint="make the step that writes them deterministic (drop logs and caches, pass SOURCE_DATE_EPOCH) "
            "or remove the files in the same RUN",
        )
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "verify-repro",
        help="build twice (the second without cache) and compare the layers Forge controls",
        description="Exit 11 when the two images differ in content; files that differ are listed (diffoscope "
        "is used on them when installed). Mtimes are counted apart unless --strict-mtimes.",
    )
    p.add_argument("distro", help="distro (debian-12) or family (debian: its default release)")
    p.add_argument("target", help="target (cpu, cpu-wheel, router, ...)")
    p.add_argument("--strict-mtimes", action="store_true", help="count files that differ only in mtime")
    add_flags(
        p,
        [o for o in cli_options() if o.field in VERIFY_BUILD_OPTIONS],
        helps={"reports_dir": "default: reports/DISTRO-TARGET/repro", "scratch_dir": "where build contexts are staged"},
    )
    p.add_argument("--keep-images", action="store_true", help="keep forge/repro-DISTRO-TARGET:first and :second")
    p.add_argument("-q", "--quiet", action="store_true", help="only Forge's own lines, not the build output")
    p.set_defaults(func=cmd_verify_repro)
