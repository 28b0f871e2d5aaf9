"""forge lock | sbom | ci, and `--locked` on forge build (verify-repro, which runs builds, is builders/verify/)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from builders import log
from builders.config.models import Distro, Recipe
from builders.errors import UsageError
from builders.options import epoch_seconds, parse_sources
from builders.project import Project
from builders.repro.errors import LockDrift, StaleRender

Handler = Callable[[argparse.Namespace], int]


def project_from(args: argparse.Namespace) -> Project:
    return Project.load(args.root)


def pair_from(project: Project, distro_name: str, target: str) -> tuple[Distro, Recipe]:
    distro, recipe = project.distro(distro_name), project.recipe_for(target)
    if not recipe.supports(distro.name):
        raise UsageError(
            f"recipes/{recipe.name}.yaml does not support {distro.name}",
            hint="`forge list` shows every distro × target",
        )
    return distro, recipe


def cmd_lock(args: argparse.Namespace) -> int:
    from builders.container import connect
    from builders.errors import SourceUnavailable
    from builders.repro.integration import check_drift
    from builders.repro.lockfile import LOCK_NAME, LockFile, PairLock, merge, notes, read_lock, write_lock
    from builders.repro.resolve import resolve_pair

    project = project_from(args)
    if len(args.pairs) % 2:
        raise UsageError(
            f"expected DISTRO TARGET pairs, got {len(args.pairs)} word(s): {' '.join(args.pairs)}",
            hint="for example `forge lock debian-12 cpu-wheel debian-13 cpu`; none: every pair",
        )
    explicit = [pair_from(project, d, t) for d, t in zip(args.pairs[::2], args.pairs[1::2], strict=True)]
    pairs = explicit or project.pairs()
    path = Path(args.lock_file) if args.lock_file else project.root / LOCK_NAME
    existing = read_lock(path) if path.exists() else LockFile()
    engine = connect(args.engine)
    console = log.console(highlight=False)
    resolved: list[PairLock] = []
    skipped: list[str] = []
    overrides = parse_sources(args.source)
    wheelhouse = Path(args.wheelhouse).resolve() if args.wheelhouse else None
    for distro, recipe in pairs:
        try:
            resolved.append(
                resolve_pair(project, distro, recipe, engine, source_overrides=overrides, wheelhouse=wheelhouse)
            )
        except SourceUnavailable as exc:
            if explicit:
                raise
            lines = exc.message.splitlines()
            first = lines[1].strip().removeprefix("- ") if len(lines) > 1 else exc.message
            skipped.append(f"{distro.name} {recipe.target}: {first}")
    if args.check:
        drifted = 0
        for entry in resolved:
            locked = existing.pairs.get(entry.key)
            if locked is None:
                console.print(f"forge: lock: {entry.key} is not in {path.name}", markup=False, soft_wrap=True)
                drifted += 1
                continue
            for line in notes(locked, entry):
                console.print(f"forge: lock: {line}", markup=False, soft_wrap=True)
            try:
                check_drift(locked, entry, path)
            except LockDrift as exc:  # report every pair before failing
                console.print(exc.render(), markup=False, soft_wrap=True)
                drifted += 1
        for line in skipped:
            console.print(f"forge: lock: not checked (inputs missing here): {line}", markup=False, soft_wrap=True)
        print(f"{len(resolved) - drifted} of {len(resolved)} locked pair(s) match {path.name}")
        return LockDrift.exit_code if drifted else 0
    write_lock(path, merge(existing, resolved))
    for entry in resolved:
        print(
            f"locked {entry.key}: base {entry.base.ref} ({len(entry.base.rootfs)} layer(s)), "
            f"{len(entry.archives)} archive(s), {len(entry.trees)} tree(s), {len(entry.wheels)} wheel(s), "
            f"SOURCE_DATE_EPOCH={entry.source_date_epoch}"
        )
    for line in skipped:
        console.print(f"forge: lock: skipped {line}", markup=False, soft_wrap=True)
    print(f"wrote {path} ({len(resolved)} pair(s) resolved, {len(skipped)} skipped)")
    return 0


def cmd_sbom(args: argparse.Namespace) -> int:
    from builders.container import connect
    from builders.repro.sbom import write_sbom

    result = write_sbom(
        connect(args.engine),
        args.image,
        Path(args.output),
        distro=args.distro or "",
        target=args.target or "",
        source_date_epoch=args.source_date_epoch,
    )
    print(
        f"{result.path} sha256:{result.sha256} ({result.os_packages} {result.package_manager} packages, "
        f"{result.python_packages} Python packages)"
    )
    return 0


def _ci_caches(args: argparse.Namespace) -> dict[str, str]:
    """--compiler-cache and --cache-registry written into the workflow instead of the repository's variables:
    checked as a build checks them, and never with a credential in them (those are secrets)."""
    from urllib.parse import urlsplit

    from builders.cache.settings import parse_compiler_cache, parse_registry

    caches: dict[str, str] = {}
    if args.compiler_cache:
        if urlsplit(args.compiler_cache).password:
            raise UsageError(
                "--compiler-cache: a password in the URL would be written into the workflow",
                hint="drop it from the URL and store it as the repository secret SCCACHE_REDIS_PASSWORD",
            )
        # The workflow's own check: the credentials are the runner's, not this machine's.
        parse_compiler_cache(
            args.compiler_cache,
            {
                "ACTIONS_RUNTIME_TOKEN": "-",
                "ACTIONS_RESULTS_URL": "-",
                "AWS_ACCESS_KEY_ID": "-",
                "AWS_SECRET_ACCESS_KEY": "-",
            },
        )
        caches["compiler_cache"] = args.compiler_cache
    if args.cache_registry:
        caches["cache_registry"] = str(parse_registry(args.cache_registry)).rsplit(":", 1)[0]
    return caches


def cmd_ci(args: argparse.Namespace) -> int:
    from builders.output import write_output
    from builders.repro.ci import GITHUB_PATH, GITLAB_PATH, render_github, render_gitlab, render_matrix

    project = project_from(args)
    caches = _ci_caches(args)
    if args.format == "github":
        text = render_github(
            project,
            runs_on=args.runs_on,
            locked=args.locked,
            allow_incomplete=args.allow_incomplete_preflight,
            **({"registry": args.registry} if args.registry else {}),
            **caches,
        )
    elif args.format == "gitlab":
        text = render_gitlab(
            project,
            tags=tuple(args.gitlab_tag or ()),
            locked=args.locked,
            allow_incomplete=args.allow_incomplete_preflight,
            **({"registry": args.registry} if args.registry else {}),
        )
    else:
        text = render_matrix(project)
    if not args.output:
        if args.check:
            raise UsageError("--check compares with a file: give it with -o PATH")
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    if args.check:
        current = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
        if current != text:
            default = {"github": GITHUB_PATH, "gitlab": GITLAB_PATH}.get(args.format, args.output)
            raise StaleRender(
                f"{path} is {'missing' if current is None else 'stale'}: distros/, recipes/ or the renderer changed",
                hint=f"regenerate it with `forge ci --format {args.format} -o {default}` and commit it",
            )
        print(f"{path} is current")
        return 0
    write_output(path, text)
    print(path)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:

    p = subparsers.add_parser(
        "lock",
        help="record every input of DISTRO TARGET pairs (base, sources, wheels, requirements) in forge.lock",
        description="Resolve from local state only (no network) what a build consumes and write it to forge.lock, "
        "sorted and hashed. With no pairs: every pair whose inputs are all here; the rest are listed as skipped.",
    )
    p.add_argument("pairs", nargs="*", metavar="DISTRO TARGET", help="pairs to lock (default: every pair)")
    p.add_argument("--lock-file", default=None, help="lock file (default: forge.lock at the project root)")
    p.add_argument("--check", action="store_true", help="compare instead of writing; exit 10 when anything drifted")
    p.add_argument("--source", action="append", metavar="NAME=PATH", help="lock a local copy of a source")
    p.add_argument("--wheelhouse", default=None, help="folder of wheels, for wheel targets")
    p.set_defaults(func=cmd_lock)

    p = subparsers.add_parser("sbom", help="write a CycloneDX 1.5 SBOM of any image (OS and Python packages)")
    p.add_argument("image", help="image reference or id, as the engine names it")
    p.add_argument("-o", "--output", default=".", help="folder for sbom.cdx.json (default: here)")
    p.add_argument("--distro", default=None, help="recorded in the SBOM's metadata")
    p.add_argument("--target", default=None, help="recorded in the SBOM's metadata")
    p.add_argument("--source-date-epoch", type=epoch_seconds, default=None, help="the SBOM's timestamp (default: 1970)")
    p.set_defaults(func=cmd_sbom)

    p = subparsers.add_parser(
        "ci",
        help="render the CI pipeline (one job per distro × target) or print the matrix",
        description="Renders from the same pairs nox sessions come from. --check exits 12 when the file is stale.",
    )
    p.add_argument(
        "--format",
        choices=("github", "gitlab", "matrix"),
        default="github",
        help="a GitHub Actions workflow, a GitLab CI file, or the matrix as JSON (default: github)",
    )
    p.add_argument("-o", "--output", default=None, help="write here instead of stdout")
    p.add_argument("--check", action="store_true", help="compare with the file at -o instead of writing it")
    p.add_argument("--runs-on", default="ubuntu-24.04", help="GitHub runner label (default: ubuntu-24.04)")
    p.add_argument("--gitlab-tag", action="append", metavar="TAG", help="GitLab runner tag (repeatable)")
    p.add_argument(
        "--registry",
        default=None,
        help="where main's images are pushed, HOST[/PATH] (default: GitHub's ghcr.io/OWNER, GitLab's "
        "$CI_REGISTRY_IMAGE)",
    )
    p.add_argument(
        "--compiler-cache",
        default=None,
        metavar="URL",
        help="GitHub: the shared compiler cache written into the workflow (default: the repository variable "
        "FORGE_COMPILER_CACHE); GitLab reads its CI/CD variable",
    )
    p.add_argument(
        "--cache-registry",
        default=None,
        metavar="HOST/REPO",
        help="GitHub: the layer-cache repository written into the workflow (default: the repository variable "
        "FORGE_CACHE_REGISTRY)",
    )
    p.add_argument("--locked", action="store_true", help="build with --locked (needs every pair in forge.lock)")
    p.add_argument(
        "--allow-incomplete-preflight",
        action="store_true",
        help="let a preflight job pass when a gate could not be evaluated (default: incomplete fails the job)",
    )
    p.set_defaults(func=cmd_ci)
