"""The CI-cache benchmark's summary: each step's rows become named figures, a goal's miss is counted by how
much, and a step that did not succeed gives no figure (a blocked step's time is not a build's)."""

from __future__ import annotations

from bench_scripts import load_bench


def test_rows_become_figures_with_goals_misses_and_counters() -> None:
    rows = [
        {
            "step": "runner-a",
            "result": "succeeded",
            "wall_s": 4000.0,
            "compiler_cache": {"redis": {"hits": 0, "misses": 489}},
        },
        {"step": "same-inputs", "result": "succeeded", "wall_s": 420.5, "compiler_cache": None},
        {"step": "python-edit", "result": "succeeded", "wall_s": 200.0, "compiler_cache": None},
        {"step": "cpp-edit", "result": "blocked", "error": "the registry answered 500"},
    ]
    figures = load_bench("bench_ci_cache").figures_of(rows)
    assert figures["runner-a.wall"].value == 4000.0 and "runner-a.goal" not in figures
    assert (figures["runner-a.redis_hits"].value, figures["runner-a.redis_misses"].value) == (0, 489)
    assert figures["same-inputs.goal"].value == 600 and "same-inputs.over_goal" not in figures
    assert figures["python-edit.over_goal"].value == 20.0
    assert not any(key.startswith("cpp-edit.") for key in figures)
