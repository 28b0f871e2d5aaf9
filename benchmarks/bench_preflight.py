"""Time until Forge reports Debian 12 as blocked, against time until a plain build of the same source reaches
vLLM's failing gate. Both measured here, in one run; the ratio is what the benchmark is for.

The plain build is Forge's own build with --skip-preflight and --no-cache, so it does what a user's
`docker build` would: install the toolchain, torch and build requirements, then configure until CMake stops.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from builders.bootstrap import ensure_base
from builders.build import BuildOptions, build
from builders.container import connect
from builders.container.select import chosen
from builders.errors import BuildFailed
from builders.preflight import run_preflight
from builders.project import Project
from builders.sources import fetch_debian_source, fetch_wheelhouse, resolve_sdist


def main() -> int:
    project = Project.load()
    engine = connect(chosen())
    distro, recipe = project.distro("debian-12"), project.recipe_for("cpu")
    ensure_base(distro, engine)
    onednn = recipe.fetched_sources[0]
    carrier = project.distro(onednn.debian_source_distro or distro.name)
    ensure_base(carrier, engine)
    fetch_debian_source(onednn, carrier, engine, project.root)
    wheelhouse = fetch_wheelhouse(project.recipe_for("cpu-wheel"), distro, project.root)
    sdist = resolve_sdist(recipe, project.root, {}).path

    start = time.monotonic()
    report = run_preflight(
        project, distro, recipe, engine=engine, source=sdist, max_jobs=1, scratch_dir=Path(tempfile.gettempdir())
    )
    preflight_s = time.monotonic() - start
    if not report.blocked:
        print("bench-preflight: Debian 12 was not blocked; nothing to compare", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory(prefix="forge-bench-") as tmp:
        start = time.monotonic()
        try:
            build(
                project,
                distro,
                recipe,
                BuildOptions(
                    skip_preflight=True,
                    no_cache=True,
                    cmake_from_pip=True,
                    torch_index="wheelhouse",
                    torch_version="2.13.0",
                    wheelhouse=wheelhouse,
                    max_jobs=1,
                    skip_tests=True,
                    reports_dir=Path(tmp),
                    tag="forge/bench-preflight:must-not-exist",
                ),
                lambda _line: None,
            )
            print("bench-preflight: the plain build did not fail", file=sys.stderr)
            return 1
        except BuildFailed:
            build_s = time.monotonic() - start
        diagnosis = json.loads((Path(tmp) / "report.json").read_text()).get("diagnosis") or {}

    blocking = ", ".join(f"{f.gate} ({f.source})" for f in report.findings if f.blocking)
    print(f"preflight blocked Debian 12 in        {preflight_s:7.1f} s  [{blocking}]")
    print(
        f"a plain build reached vLLM's gate in  {build_s:7.1f} s  [{diagnosis.get('category')}: "
        f"{diagnosis.get('line', '')[:70]}]"
    )
    print(f"ratio (plain build / preflight):      {build_s / preflight_s:7.1f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
