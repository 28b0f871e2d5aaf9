"""The warm-machine benchmark's summary: a run through a shared compiler cache is saved under a name of its own
(its cold row is not a cold compile, so it must not replace results/rebuild.json), with that cache's counters, and
a compiler-cache URL it cannot use is refused before any build, naming the flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_scripts import load_bench

from builders.project import Project
from builders.results import LoadWatch, unsaved_because

ROOT = Path(__file__).resolve().parents[2]


ROWS: list[dict[str, Any]] = [
    {"step": "cold", "result": "succeeded", "wall_s": 900.0, "ccache": None, "compiler_cache": None},
    {
        "step": "cpp-edit",
        "result": "succeeded",
        "wall_s": 250.0,
        "ccache": None,
        "compiler_cache": {"redis": {"hits": 486, "misses": 3}},
    },
    {"step": "python-edit", "result": "succeeded", "wall_s": 75.5, "ccache": None, "compiler_cache": None},
]


def test_a_shared_cache_run_has_its_own_name_counters_and_note() -> None:
    bench = load_bench("bench_rebuild")
    shared = bench.result(ROWS, ["--max-jobs", "2"], LoadWatch.start(), Project.load(), shared_cache="redis://h:1")
    assert shared.name == "rebuild-shared-cache"
    assert "redis://h:1" in shared.provenance.note
    assert (shared.figures["cpp-edit.redis_hits"].value, shared.figures["cpp-edit.redis_misses"].value) == (486, 3)
    assert shared.figures["python-edit.over_goal"].value == 15.5 and "cpp-edit.over_goal" not in shared.figures
    local = bench.result(ROWS, [], LoadWatch.start(), Project.load())
    assert local.name == "rebuild" and "shared compiler cache" not in local.provenance.note


def test_an_unusable_compiler_cache_url_is_refused_before_any_build() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_rebuild.py"), "--compiler-cache", "ftp://nowhere/x"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--compiler-cache" in proc.stderr and "redis://HOST:PORT" in proc.stderr  # the flag, and what to give
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""  # no step started


def test_a_run_with_a_step_that_did_not_succeed_leaves_the_results_file_alone() -> None:
    # A run stopped by preflight's disk gate once replaced a measured file with its blocked row.
    assert unsaved_because(ROWS) is None
    blocked = [*ROWS, {"step": "requirements", "result": "blocked", "error": "disk"}]
    assert unsaved_because(blocked) == "requirements: blocked"
    assert unsaved_because([]) == "no step ran"


def test_until_before_resume_is_refused_naming_both_flags() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_rebuild.py"), "--resume", "cpp-edit", "--until", "cold"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "--until cold comes before --resume cpp-edit" in proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
