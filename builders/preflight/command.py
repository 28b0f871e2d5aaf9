"""`forge preflight DISTRO TARGET`: every gate, in seconds, before any compile."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import get_args

from builders.config.models import TorchIndex
from builders.container import Engine, connect
from builders.errors import EngineError, PreflightBlocked, PreflightIncomplete, UsageError
from builders.gates.findings import render_table
from builders.gates.host import parse_cpu_flags
from builders.input_files import read_bounded
from builders.log import Log
from builders.options import add_gpu_args, gpu_args_apply, parse_sources, pep440_version, positive_int
from builders.platforms import for_platform, parse_platforms
from builders.preflight.gpu_gate import add_gpu_gate_args, gate_input, preflight_findings, with_finding
from builders.preflight.runner import run_preflight
from builders.project import Project
from builders.target import Target

FLAGS_LIMIT_BYTES = 4 * 2**20
"""A /proc/cpuinfo of 1,024 CPUs is about 2 MiB; every CPU repeats the same flags, so what is beyond is cut."""


def read_flags_file(path: Path) -> frozenset[str]:
    """A copy of the run host's /proc/cpuinfo, or just its flags separated by spaces or newlines."""
    hint = "save the run host's /proc/cpuinfo (or its flags line) to a file"
    got = read_bounded(path, limit=FLAGS_LIMIT_BYTES, what="--run-host-flags", hint=hint)
    data = got.data
    if got.cut:
        data = data[: data.rfind(b"\n") + 1]  # a cut line could end inside a flag's name
        print(f"forge: warning: {got.note(path, FLAGS_LIMIT_BYTES)}", file=sys.stderr)
    text = data.decode("utf-8", errors="replace")
    flags = parse_cpu_flags(text)
    if not flags:
        flags = frozenset(w for w in text.split() if w.replace("_", "").replace(".", "").isalnum())
    if not flags:
        raise UsageError(
            f"--run-host-flags {path}: no CPU flags in it",
            hint="copy the run host's /proc/cpuinfo, e.g. `ssh runhost cat /proc/cpuinfo > flags.txt`",
        )
    return flags


def split_sources(values: list[str] | None) -> tuple[Path | None, dict[str, Path]]:
    """--source values: a bare path is the engine's own source (at most one); NAME=PATH names another checkout,
    parsed as `forge build` parses it. A path that exists is always a path, whatever characters it holds."""
    named = [v for v in values or [] if "=" in v and not Path(v).exists()]
    plain = [v for v in values or [] if v not in named]
    if len(plain) > 1:
        raise UsageError(
            f"--source given {len(plain)} paths ({', '.join(plain)}): one is the engine's source",
            hint="name the others as NAME=PATH (for example --source sgl-kernel=/src/sglang)",
        )
    local = parse_sources(named)
    if "vllm" in local:
        if plain:
            raise UsageError("--source vllm=PATH and a bare --source PATH both name the engine's source")
        plain = [str(local.pop("vllm"))]
    return (Path(plain[0]) if plain else None), local


def cmd_preflight(args: argparse.Namespace) -> int:
    project = Project.load(args.root)
    (plat,) = parse_platforms(args.platform)
    distro = for_platform(project.distro(args.distro), plat)
    recipe = project.recipe_for(args.target)
    if not recipe.supports(distro.name):
        raise UsageError(
            f"recipes/{recipe.name}.yaml does not support {distro.name}",
            hint=f"it supports: {', '.join(recipe.distros) if recipe.distros != 'all' else 'all'}",
        )
    gpu_args_apply(Target.resolve(distro, recipe), args)
    run_flags = read_flags_file(Path(args.run_host_flags)) if args.run_host_flags else None
    engine: Engine | None
    try:
        engine = connect(args.engine)
    except EngineError:
        engine = None  # preflight then runs on declared facts and says so
    source, given_sources = split_sources(args.source)
    report = run_preflight(
        project,
        distro,
        recipe,
        engine=engine,
        source=source,
        max_jobs=args.max_jobs,
        scratch_dir=Path(args.scratch_dir) if args.scratch_dir else Path(tempfile.gettempdir()),
        probe=not args.no_probe,
        run_host_flags=run_flags,
        run_host_source=args.run_host_flags,
        wheelhouse=[Path(w) for w in args.wheelhouse or ()],
        gpu_mode=args.gpu_mode,
        torch_index=args.torch_index,
        torch_version=args.torch_version,
        fetch=not args.no_fetch,
        progress=Log().info,  # stderr: --json keeps stdout to the report alone
        given_sources=given_sources,
    )
    declared = (recipe.cuda.arch_list, f"recipes/{recipe.name}.yaml: cuda.arch_list") if recipe.cuda else None
    # The image's CUDA: the recipe's where its runtime comes from PyPI's wheels, else the distro's CUDA base.
    if recipe.cuda and recipe.cuda.runtime:
        cuda: tuple[str, str] | None = (recipe.cuda.runtime, f"recipes/{recipe.name}.yaml: cuda.runtime")
    elif distro.cuda:
        cuda = (distro.cuda.version, f"distros/{distro.name}.yaml: cuda.version")
    else:
        cuda = None
    gate = gate_input(args, default_archs=declared if recipe.device == "cuda" else None, default_cuda=cuda)
    if gate is not None:
        report = with_finding(report, *preflight_findings(gate))
    if args.json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        render_table(report, sys.stdout, show_passed=not args.problems_only)
    if report.blocked:
        if not args.json:
            first = report.blocking[0]
            print(
                PreflightBlocked(
                    f"{first.gate}: {first.found} vs {first.required} ({first.source})", hint=first.remedy
                ).render(),
                file=sys.stderr,
            )
        return PreflightBlocked.exit_code
    if not report.complete:
        if not args.json:
            print(
                PreflightIncomplete(
                    f"not evaluated: {', '.join(report.not_evaluated)}",
                    hint=next(f.remedy for f in report.findings if not f.evaluated)
                    + (
                        " (accepted: --allow-incomplete)"
                        if args.allow_incomplete
                        else " — or pass --allow-incomplete to accept an incomplete answer"
                    ),
                ).render(),
                file=sys.stderr,
            )
        return 0 if args.allow_incomplete else PreflightIncomplete.exit_code
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "preflight",
        help="check in seconds whether DISTRO can build TARGET: source gates, real base, host, torch index",
        description="Every gate a build would hit, each with what was found, what is required, where that "
        "comes from (vLLM file:line, distro file, host) and what to do. The pinned vLLM source is fetched into "
        "the source cache when missing. Exit codes: 0 clear; 3 blocked (a gate blocks); 9 incomplete (nothing "
        "blocks, but a gate could not be evaluated — never reported as clear; --allow-incomplete makes it 0).",
    )
    p.add_argument("distro", help="distro (debian-12) or family (debian: its default release)")
    p.add_argument("target", help="target (cpu, cpu-wheel, ...)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--platform", default=None, help="linux/amd64 (default) or linux/arm64: the image's platform")
    p.add_argument(
        "--source",
        action="append",
        default=None,
        metavar="PATH_OR_SDIST",
        help="the engine's source directory or sdist (default: the recipe's pinned sdist in the source cache); "
        "NAME=PATH, as `forge build` takes it, names another checkout the build needs (sgl-kernel=PATH)",
    )
    p.add_argument(
        "--max-jobs",
        type=positive_int,
        default=None,
        help="compile jobs to check RAM for, 1 or more (default: derived)",
    )
    p.add_argument("--scratch-dir", default=None, help="where the build stages its context (default: the temp dir)")
    p.add_argument("--no-probe", action="store_true", help="do not probe the base image: declared facts only")
    p.add_argument(
        "--no-fetch",
        action="store_true",
        help="do not download the pinned vLLM sdist when it is not cached (its gates are then not evaluated)",
    )
    p.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="exit 0 when nothing blocks but some gate could not be evaluated (the verdict still says incomplete)",
    )
    p.add_argument(
        "--torch-version",
        type=pep440_version,
        default=None,
        metavar="VERSION",
        help="the torch the build will install, a PEP 440 version (default: vLLM's pin)",
    )
    p.add_argument(
        "--torch-index",
        choices=get_args(TorchIndex),
        default=None,
        help="the index the build will take torch from, as given to `forge build` (default: the recipe's)",
    )
    p.add_argument(
        "--run-host-flags",
        default=None,
        metavar="FILE",
        help="/proc/cpuinfo (or its flags) of the host the image will run on (default: this host)",
    )
    p.add_argument(
        "--wheelhouse",
        action="append",
        default=None,
        metavar="DIR",
        help="folder of wheels, for targets whose torch comes from a wheelhouse",
    )
    p.add_argument("--problems-only", action="store_true", help="list only blocking and warning findings")
    add_gpu_args(p)
    add_gpu_gate_args(p)
    p.set_defaults(func=cmd_preflight)
