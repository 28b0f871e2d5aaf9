"""The dev loop on a real vLLM tree: how long each kind of edit takes to rebuild, what was rebuilt, what ccache
did. Five builds of one tree, in order, into one reports folder (so each report names the files changed since
the one before):

    cold          the tree as given, with --no-cache: every layer built, every translation unit compiled
    no-change     the same tree again: every layer from the engine's cache
    python-edit   one line added to vllm/logger.py: only the package overlay
    cpp-edit      one line added to csrc/cpu/activation.cpp: the extension, one translation unit compiled
    requirements  one comment line added to requirements/cpu.txt: the environment and everything above it

    python benchmarks/bench_rebuild.py [--source DIR] [--distro debian-13] [--max-jobs N] [--torch-index pypi]
                                       [--resume STEP] [--until STEP] [--compiler-cache URL]

--resume STEP applies the edits of the steps before STEP without building them, and takes their rows from
their reports in the same folder (wall time: the sum of the report's phases, which is what the build call
spends): a run stopped at one step (the host's disk, say) goes on from there instead of compiling cold again.

--until STEP stops after that step (the steps after it are not rows: the results file has no figure for them).

--compiler-cache URL builds every step through that shared compiler cache (`forge build --compiler-cache`, its
credentials from the environment as there), for instance the Redis a `bench-ci-cache` run filled: the cold step
then takes its objects from it, so its row is not a cold compile, and the warm steps are measured in an hour less.
Such a run saves results/rebuild-shared-cache.json, never results/rebuild.json (whose cold row is a cold compile).

--source is a vLLM checkout or unpacked sdist; without it the recipe's pinned sdist is unpacked into a
scratch folder (fetched first if it is not cached). The tree is copied before editing: the source is never
changed. Results go to reports/bench-rebuild/results.json and are printed as a table; `--save` (which
`nox -s bench-rebuild` passes) also writes results/rebuild.json, the summary the README quotes. It takes an hour
or more (the cold build compiles all of vLLM's CPU kernels), so no test suite runs it: `nox -s bench-rebuild`.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from builders.build import BuildOptions, build
from builders.cache.settings import ENV_COMPILER, parse_compiler_cache
from builders.config.models import TorchIndex
from builders.errors import ForgeError
from builders.project import Project
from builders.results import Figure, LoadWatch, Result, unsaved_because
from builders.sources import resolve_sdist

Edit = Callable[[Path], None]


def _append(rel: str, line: str) -> Edit:
    def edit(tree: Path) -> None:
        path = tree / rel
        path.write_text(path.read_text() + line + "\n")

    return edit


def _nothing(_tree: Path) -> None:
    return None


# The C++ edit's value is this run's own: the compiler cache outlives a run (a cache mount, a shared cache), and
# a line an earlier run compiled would be a hit, not the one file's compile the row is for.
RUN_VALUE = secrets.randbelow(2**31 - 1)

# An edit that changes code, not only a comment: a comment leaves the preprocessed text alone, and ccache would
# answer it from its cache in preprocessed mode without compiling anything.
STEPS: tuple[tuple[str, Edit, bool], ...] = (
    ("cold", _nothing, True),
    ("no-change", _nothing, False),
    ("python-edit", _append("vllm/logger.py", "_FORGE_BENCH_REBUILD = 1"), False),
    (
        "cpp-edit",
        _append("csrc/cpu/activation.cpp", f"[[maybe_unused]] static const int forge_bench_rebuild = {RUN_VALUE};"),
        False,
    ),
    ("requirements", _append("requirements/cpu.txt", "# forge bench-rebuild: the environment's key changes"), False),
)


def _tree(project: Project, source: Path | None, scratch: Path) -> Path:
    tree = scratch / "vllm"
    if source is not None:
        shutil.copytree(source, tree, symlinks=True, ignore=shutil.ignore_patterns(".git", "build", "__pycache__"))
        return tree
    sdist = resolve_sdist(project.recipe_for("cpu"), project.root, {}).path
    with tarfile.open(sdist) as archive:
        archive.extractall(scratch / "unpacked", filter="data")
    (unpacked,) = (scratch / "unpacked").iterdir()
    unpacked.rename(tree)
    return tree


def _row(step: str, seconds: float, report: dict[str, Any]) -> dict[str, Any]:
    reuse = report.get("reuse") or {}
    ccache = reuse.get("ccache")
    return {
        "step": step,
        "result": report.get("result"),
        "wall_s": round(seconds, 1),
        "environment": (reuse.get("environment") or {}).get("verdict"),
        "extension": (reuse.get("extension") or {}).get("verdict"),
        "package": (reuse.get("package") or {}).get("verdict"),
        "changed": sorted(
            {
                f
                for part in ("environment", "extension", "package")
                for f in (reuse.get(part) or {}).get("changed_files") or []
            }
        ),
        "ccache": ccache,
        "compiler_cache": (reuse.get("compiler_cache") or {}).get("backends"),
    }


# Issue 40's goals for a step's wall time (seconds).
GOALS = {"no-change": 30, "python-edit": 60, "cpp-edit": 300}


def result(
    rows: list[dict[str, Any]], argv: list[str], watch: LoadWatch, project: Project, *, shared_cache: str | None = None
) -> Result:
    """The run as results/rebuild.json (rebuild-shared-cache.json with a shared compiler cache): each step's wall
    time, its goal and by how much it missed, the compiler caches' counters."""
    figures: dict[str, Figure | tuple[int | float, str]] = {}
    for row in rows:
        step = row["step"]
        figures[f"{step}.wall"] = (row["wall_s"], "s")
        if step in GOALS:
            figures[f"{step}.goal"] = (GOALS[step], "s")
            if row["wall_s"] > GOALS[step]:
                figures[f"{step}.over_goal"] = (round(row["wall_s"] - GOALS[step], 1), "s")
        ccache = row.get("ccache")
        if isinstance(ccache, dict):
            figures[f"{step}.ccache_hits"] = (int(ccache["hits"]), "count")
            figures[f"{step}.ccache_misses"] = (int(ccache["misses"]), "count")
        for backend, counts in (row.get("compiler_cache") or {}).items():
            for key in ("hits", "misses"):
                figures[f"{step}.{backend}_{key}"] = (int(counts[key]), "count")
    recipe = project.recipe_for("cpu")
    pin = recipe.source.pypi if recipe.source else None
    return Result.capture(
        "rebuild-shared-cache" if shared_cache else "rebuild",
        command="nox -s bench-rebuild -- " + " ".join(argv),
        figures=figures,
        versions={"vllm": str(pin.version) if pin else "?", "python": sys.version.split()[0]},
        load=watch,
        source="reports/bench-rebuild/results.json",
        note=(
            f"every step through the shared compiler cache {shared_cache} (the cold step's objects came from it); "
            if shared_cache
            else ""
        )
        + "test stage skipped in every step; "
        + ", ".join(f"{r['step']}: {r['result']}" for r in rows),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--source", type=Path, help="a vLLM checkout or unpacked sdist (default: the pinned sdist)")
    parser.add_argument("--distro", default="debian-13")
    parser.add_argument("--max-jobs", type=int, default=None)
    # The recipe's torch comes from PyTorch's CPU index; where that is unreachable, PyPI's torch (`forge build
    # --torch-index pypi`) is the one a build can get.
    parser.add_argument("--torch-index", choices=get_args(TorchIndex), default=None)
    parser.add_argument("--resume", choices=[step for step, _, _ in STEPS[1:]], default=None)
    parser.add_argument("--until", choices=[step for step, _, _ in STEPS], default=None)
    parser.add_argument(
        "--compiler-cache",
        metavar="URL",
        default=None,
        help="every step through this shared compiler cache (as forge build's flag); saves rebuild-shared-cache.json",
    )
    parser.add_argument("--save", action="store_true", help="also write results/rebuild.json")
    args = parser.parse_args(argv)
    if args.compiler_cache is not None:
        # Parsed the way forge build parses it, so a typo is this flag's error before an hour of building.
        try:
            parse_compiler_cache(args.compiler_cache, os.environ)
        except ForgeError as exc:
            parser.error(exc.message + (f" ({exc.hint})" if exc.hint else ""))
        os.environ[ENV_COMPILER] = args.compiler_cache
    watch = LoadWatch.start()
    names = [step for step, _, _ in STEPS]
    first = names.index(args.resume) if args.resume else 0
    last = names.index(args.until) if args.until else len(names) - 1
    if last < first:
        parser.error(f"--until {args.until} comes before --resume {args.resume}")
    project = Project.load()
    distro, recipe = project.distro(args.distro), project.recipe_for("cpu")
    out = project.root / "reports" / "bench-rebuild"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tree-manifest.json").unlink(missing_ok=True)  # the cold build names no changes
    rows = []
    with tempfile.TemporaryDirectory(prefix="forge-bench-rebuild-") as scratch:
        tree = _tree(project, args.source, Path(scratch))
        for index, (step, edit, cold) in enumerate(STEPS[: last + 1]):
            edit(tree)
            if index < first:
                earlier = json.loads((out / step / "report.json").read_text())
                rows.append(_row(step, sum(earlier["phases"].values()), earlier) | {"from_report": True})
                continue
            start = time.monotonic()
            try:
                report = build(
                    project,
                    distro,
                    recipe,
                    BuildOptions(
                        source_overrides={"vllm": tree},
                        reports_dir=out / step,
                        no_cache=cold,
                        skip_tests=True,  # the test stage's minutes are the same for every step: not what is measured
                        max_jobs=args.max_jobs,
                        torch_index=args.torch_index,
                    ),
                    lambda line: print(line, flush=True),
                )
            except ForgeError as exc:
                # A step that stops before its build (preflight's disk gate, say) is a row that says so, and
                # the table of the steps before it is still written.
                rows.append(
                    {
                        "step": step,
                        "result": "blocked",
                        "wall_s": round(time.monotonic() - start, 1),
                        "error": exc.message,
                    }
                )
                break
            rows.append(_row(step, time.monotonic() - start, json.loads(report.to_json())))
            # The next step's build compares with this one's manifest: carry it to the next step's folder.
            manifest = out / step / "tree-manifest.json"
            if manifest.exists() and index + 1 < len(names):
                following = names[index + 1]
                (out / following).mkdir(parents=True, exist_ok=True)
                shutil.copy2(manifest, out / following / "tree-manifest.json")
            if report.result != "succeeded":
                break
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    if args.save and (why := unsaved_because(rows)):
        print(f"bench-rebuild: results left as they were (this run: {why})")
    elif args.save:
        given = sys.argv[1:] if argv is None else argv
        print(
            "bench-rebuild: wrote "
            + str(
                result(
                    rows, [a for a in given if a != "--save"], watch, project, shared_cache=args.compiler_cache
                ).save(project.root)
            )
        )
    print(f"{'step':<14}{'wall s':>8}  {'env':<10}{'extension':<11}{'package':<10}compiler cache")
    for row in rows:
        ccache = row.get("ccache", row.get("error"))
        parts = [f"ccache {ccache['hits']} hits {ccache['misses']} misses"] if isinstance(ccache, dict) else []
        parts += [
            f"{name} {c['hits']} hits {c['misses']} misses" for name, c in (row.get("compiler_cache") or {}).items()
        ]
        stats = "; ".join(parts) or str(ccache)[:40]
        print(
            f"{row['step']:<14}{row['wall_s']:>8}  {row.get('environment')!s:<10}{row.get('extension')!s:<11}"
            f"{row.get('package')!s:<10}{stats}"
        )
    return 0 if all(row["result"] == "succeeded" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
