"""Every case run as its own test (each layout case once per layout): the tests `nox -s kvlab-mutation` runs
against each mutant, so mutmut can pick the few that reach a mutated function and stop at the first failure."""

from __future__ import annotations

import pytest

from builders.kvlab.cases import Case
from builders.kvlab.check import run_case, runs

RUNS = runs()


@pytest.mark.parametrize(("case", "layout"), RUNS, ids=[f"{c.name}-{layout or c.target}" for c, layout in RUNS])
def test_case(case: Case, layout: str | None) -> None:
    outcome = run_case(case, layout)
    assert outcome.passed, outcome.detail
