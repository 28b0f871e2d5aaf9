"""Running the cases, and the planted bugs against them.

A layout case runs once per layout; the others once. A mutant is a layout (or the pool) with one planted bug:
it is caught when at least one case fails against it, and it survives when every case passes.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from builders.kvlab.cases import CASES, REQUIRED_FEATURES, Case, CaseFailed, Ctx, coverage
from builders.kvlab.layouts import LAYOUTS
from builders.kvlab.pool import POOL_BUGS

POOL_BUG_WHY = {
    "no-hit-cap": "lets a prefix hit cover the whole prompt, leaving no token to compute",
    "mru-eviction": "puts freed blocks at the head of the free queue, evicting the most recently used first",
    "window-frees-extra": "frees the block that holds the sliding window's first key",
}


@dataclass(frozen=True)
class Outcome:
    case: str
    layout: str | None
    passed: bool
    detail: str
    seconds: float
    comparisons: int
    worst_error: float


def run_case(case: Case, layout: str | None, *, layout_bug: str | None = None, pool_bug: str | None = None) -> Outcome:
    ctx = Ctx(case, layout_name=layout or "paged", layout_bug=layout_bug, pool_bug=pool_bug)
    start = time.perf_counter()
    try:
        case.run(ctx)
        passed, detail = True, f"{ctx.comparisons} comparisons, max |error| {ctx.worst:.2g}"
    except (CaseFailed, AssertionError) as exc:
        passed, detail = False, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    except Exception as exc:  # a planted bug may crash a layout: that is a catch too, and says where
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        passed, detail = False, f"{type(exc).__name__}: {exc} ({frame.name}, line {frame.lineno})"
    return Outcome(case.name, layout, passed, detail, time.perf_counter() - start, ctx.comparisons, ctx.worst)


def runs(cases: Sequence[Case] = CASES, layouts: Iterable[str] = LAYOUTS) -> list[tuple[Case, str | None]]:
    names = list(layouts)
    return [(c, name) for c in cases for name in (names if c.target == "layouts" else [None])]


def run_all(cases: Sequence[Case] = CASES, layouts: Iterable[str] = LAYOUTS) -> list[Outcome]:
    return [run_case(c, layout) for c, layout in runs(cases, layouts)]


@dataclass(frozen=True)
class Mutant:
    target: str
    """A layout's name, or "pool"."""
    bug: str
    why: str


def mutants() -> list[Mutant]:
    out = [Mutant(name, bug, why) for name, cls in LAYOUTS.items() for bug, why in cls.bugs.items()]
    return out + [Mutant("pool", bug, POOL_BUG_WHY[bug]) for bug in POOL_BUGS]


@dataclass(frozen=True)
class MutantOutcome:
    mutant: Mutant
    caught_by: str | None
    detail: str
    cases_run: int


def run_mutant(mutant: Mutant, cases: Sequence[Case] = CASES) -> MutantOutcome:
    """Cases in order until one fails. A pool bug runs the pool cases and every layout case on `paged`."""
    ran = 0
    if mutant.target == "pool":
        # The pool's own cases first, the seconds-long fuzz last: most pool bugs show in a direct case.
        cases = sorted(cases, key=lambda c: (c.target != "pool", "pool-invariants" in c.features))
    for case in cases:
        if mutant.target == "pool":
            if case.target not in ("pool", "layouts"):
                continue
            outcome = run_case(case, "paged", pool_bug=mutant.bug)
        else:
            if case.target != "layouts":
                continue
            outcome = run_case(case, mutant.target, layout_bug=mutant.bug)
        ran += 1
        if not outcome.passed:
            return MutantOutcome(mutant, case.name, outcome.detail, ran)
    return MutantOutcome(mutant, None, "every case passed", ran)


def uncovered() -> list[str]:
    return [feature for feature, names in coverage().items() if not names]


__all__ = ["REQUIRED_FEATURES", "Mutant", "MutantOutcome", "Outcome", "mutants", "run_all", "run_mutant", "uncovered"]
